# fp8moe build. `make help` lists the targets.
#   make            libfp8moe.a and the fp8moe binary (CUDA sources too when nvcc is found)
#   make test       unit, golden-model and CLI tests (cmocka)
#   make asan       the tests again under AddressSanitizer + UndefinedBehaviorSanitizer
CC      ?= cc
BUILD   ?= build
OPT     ?= -O2
SAN     ?=
CFLAGS_ALL = -std=c11 -D_DEFAULT_SOURCE $(OPT) $(SAN) -g -Wall -Wextra -Werror -MMD -MP -fopenmp -Iinclude -Isrc $(EXTRA_CFLAGS)
LDLIBS_ALL = -lcjson -lpcre2-8 -lutf8proc -lmicrohttpd -lpthread -lm -fopenmp $(SAN)

# CUDA: compiled whenever nvcc is present (CI has it; the GPU machine has it). NVCC= builds without it.
NVCC    ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
CUDA_ARCHS = -gencode=arch=compute_90a,code=sm_90a -gencode=arch=compute_89,code=sm_89
# the archs by name ("sm_90a sm_89"), for the refusal of a GPU the binary has no kernels for (device_info.cu)
CUDA_ARCH_LIST = $(strip $(patsubst code=%,%,$(filter code=%,$(subst $(comma), ,$(CUDA_ARCHS)))))
comma := ,
NVCCFLAGS = -std=c++20 -O2 -g -lineinfo $(CUDA_ARCHS) -DFM_CUDA_ARCH_LIST='"$(CUDA_ARCH_LIST)"' -Iinclude -Isrc \
            -Xcompiler -Wall,-Wextra,-Werror -MMD -MP

LIB_SRC  := $(shell find src -name '*.c' ! -path 'src/cli/*' | sort)
CLI_SRC  := $(sort $(wildcard src/cli/*.c))
CU_SRC   := $(sort $(wildcard src/backend/cuda/*.cu))
# The yardsticks the bench commands measure against (cuBLASLt FP8 anchors): their own library, linked into the
# fp8moe binary and the GPU tests that use them, never into libfp8moe.a.
BENCH_CU_SRC := $(sort $(wildcard bench/anchors/*.cu))
ifneq ($(NVCC),)
  LIB_SRC := $(filter-out src/backend/cuda/no_cuda.c,$(LIB_SRC))
  CFLAGS_ALL += -DFM_HAVE_CUDA=1
  LDLIBS_ALL += -L$(CUDA_HOME)/lib64 -lcublasLt -lcublas -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart_static -lrt -ldl -lpthread -lstdc++
  CU_OBJ := $(CU_SRC:%.cu=$(BUILD)/%.o)
  BENCH_LIB := $(BUILD)/libfp8moe_bench.a
else
  CU_OBJ :=
  BENCH_LIB :=
endif

LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o) $(CU_OBJ)
CLI_OBJ  := $(CLI_SRC:%.c=$(BUILD)/%.o)
# The bench commands: a program of their own (fp8moe-bench; `fp8moe bench` runs it from beside itself). It links the
# command line's helpers (every src/cli object but main, as an archive), the anchors and the library.
BENCH_CLI_SRC := $(sort $(wildcard bench/cli/*.c))
BENCH_CLI_OBJ := $(BENCH_CLI_SRC:%.c=$(BUILD)/%.o)
CLI_HELPERS := $(BUILD)/libfp8moe_cli.a
TEST_SRC := $(sort $(wildcard tests/test_*.c))
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
TEST_SUPPORT := $(filter-out $(TEST_SRC),$(wildcard tests/*.c))
TEST_SUPPORT_OBJ := $(TEST_SUPPORT:%.c=$(BUILD)/%.o)

LIB := $(BUILD)/libfp8moe.a
BIN := $(BUILD)/fp8moe
BENCH_BIN := $(BUILD)/fp8moe-bench

.PHONY: all check-layers test test-serve test-gpu asan fuzz fuzz-run deps run clean help tests-build format format-check fp8moe-bench
all: $(LIB) $(BIN) $(BENCH_BIN)
fp8moe-bench: $(BENCH_BIN)

$(LIB): $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/libfp8moe_bench.a: $(BENCH_CU_SRC:%.cu=$(BUILD)/%.o)
	@rm -f $@
	ar rcs $@ $^

$(CLI_HELPERS): $(filter-out $(BUILD)/src/cli/main.o,$(CLI_OBJ))
	@rm -f $@
	ar rcs $@ $^

# the bench commands include bench/anchors/*.cuh
$(BENCH_CLI_OBJ): CFLAGS_ALL += -Ibench

$(BIN): $(CLI_OBJ) $(LIB)
	$(CC) -o $@ $(CLI_OBJ) $(LIB) $(LDLIBS_ALL)

$(BENCH_BIN): $(BENCH_CLI_OBJ) $(CLI_HELPERS) $(BENCH_LIB) $(LIB)
	$(CC) -o $@ $(BENCH_CLI_OBJ) $(CLI_HELPERS) $(BENCH_LIB) $(LIB) $(LDLIBS_ALL)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -c $< -o $@

$(BUILD)/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

$(TEST_BIN): $(BUILD)/tests/%: tests/%.c $(TEST_SUPPORT_OBJ) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -o $@ $< $(TEST_SUPPORT_OBJ) $(LIB) -lcmocka $(LDLIBS_ALL)

tests-build: $(TEST_BIN) $(BIN) $(BENCH_BIN)

# Each test binary runs from the repository root; FP8MOE_BIN lets the CLI tests find the binary.
test: tests-build
	@set -e; fail=0; tools/check-layers.sh || fail=1; tools/check-includes.sh || fail=1; for t in $(TEST_BIN); do \
	  echo "== $$t"; FP8MOE_BIN=$(BIN) ./$$t || fail=1; \
	done; \
	echo "== tests/serve/run.sh (fp8moe serve under ASan against the openai client, curl and Chromium)"; \
	$(MAKE) --no-print-directory test-serve || fail=1; \
	if [ $$fail = 0 ]; then echo "ALL TESTS PASSED"; else echo "SOME TESTS FAILED"; exit 1; fi

# fp8moe serve against real clients (tests/serve/run.sh: the openai npm package, curl, headless Chromium), the server
# built with ASan + UBSan for the whole run: a leak, a memory error or a KV block left in use fails it.
SAN_FLAGS = -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
test-serve:
	@$(MAKE) --no-print-directory BUILD=build/asan OPT=-O2 NVCC= SAN="$(SAN_FLAGS)" build/asan/fp8moe >/dev/null
	@tests/serve/run.sh build/asan/fp8moe

# GPU tests (need a GPU; run through the device tool): every CUDA op against the CPU op, whole-model parity.
GPU_TEST_SRC := $(sort $(wildcard tests/gpu/test_*.c))
GPU_TEST_BIN := $(GPU_TEST_SRC:tests/gpu/%.c=$(BUILD)/tests/gpu/%)
GPU_TEST_SUPPORT_OBJ := $(BUILD)/tests/gpu/gpu_test_util.o $(BUILD)/tests/gpu/fold_test_util.o $(BUILD)/tests/kv_steps.o \
                        $(BUILD)/tests/logits_diff.o $(BUILD)/tests/sched_recorder.o
$(BUILD)/tests/gpu/fold_test_util.o: CFLAGS_ALL += -I$(CUDA_HOME)/include
# the GPU tests of the bench anchors link their library
GPU_TEST_BENCH := $(BUILD)/tests/gpu/test_cuda_moe_cublaslt
$(GPU_TEST_BENCH): $(BENCH_LIB)
$(GPU_TEST_BENCH): BENCH_LINK = $(BENCH_LIB)
$(GPU_TEST_BENCH): CFLAGS_ALL += -Ibench
$(GPU_TEST_BIN): $(BUILD)/tests/gpu/%: tests/gpu/%.c $(GPU_TEST_SUPPORT_OBJ) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -I$(CUDA_HOME)/include -o $@ $< $(GPU_TEST_SUPPORT_OBJ) $(BENCH_LINK) $(LIB) -lcmocka $(LDLIBS_ALL)
test-gpu: $(GPU_TEST_BIN) $(BIN) $(BENCH_BIN)
	@set -e; for t in $(GPU_TEST_BIN); do echo "== $$t"; ./$$t; done; echo "ALL GPU TESTS PASSED"

asan:
	$(MAKE) BUILD=build/asan OPT=-O2 NVCC= \
	  SAN="$(SAN_FLAGS)" test

# libFuzzer target for the safetensors + config + shard-index parsers (clang).
FUZZ_SRC := fuzz/fuzz_loader.c src/io/safetensors.c src/io/safetensors_dir.c src/io/json.c src/io/config.c src/io/quant_config.c src/io/ckpt_regex.c \
            src/model/arch.c src/model/qwen3_moe.c src/model/mixtral.c src/model/qwen3_next.c \
            src/util/status.c src/util/file.c $(wildcard src/quant/*.c)
$(BUILD)/fuzz/fuzz_loader: $(FUZZ_SRC)
	@mkdir -p $(dir $@)
	clang -std=c11 -D_DEFAULT_SOURCE -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude -Isrc -o $@ $(FUZZ_SRC) -lcjson -lpcre2-8 -lm
fuzz: $(BUILD)/fuzz/fuzz_loader
FUZZ_SECONDS ?= 60
fuzz-run: fuzz
	@mkdir -p $(BUILD)/fuzz/corpus
	./$(BUILD)/fuzz/fuzz_loader -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 $(BUILD)/fuzz/corpus fuzz/seeds

# Installs the Debian packages the build needs when they are missing (root or sudo).
deps:
	@./tools/install-deps.sh

# The main job: a completion by the bundled trained model (it learnt Python source) through its tokenizer, streamed
# with tokens/s, on the CPU and on the GPU when one is present; then the parity table of the presets against the
# fp32 oracle (on the GPU too: the presets the CUDA backend runs, ref, int4, fp8).
RUN_PROMPT := def read_lines(path):\n    with open(path) as f:
run: all
	@P="$$(printf '$(RUN_PROMPT)')"; \
	echo "== models/tiny-code-moe completes a Python function (CPU, greedy)"; printf '%s' "$$P"; \
	./$(BIN) generate --model models/tiny-code-moe --prompt "$$P" --max-tokens 48 --temperature 0 && \
	if nvidia-smi -L >/dev/null 2>&1; then \
	  echo; echo "== the same on the GPU (cuda backend, fp8 preset)"; printf '%s' "$$P"; \
	  ./$(BIN) generate --model models/tiny-code-moe --prompt "$$P" --max-tokens 48 --temperature 0 \
	    --backend cuda --preset fp8; fi
	@echo
	@if nvidia-smi -L >/dev/null 2>&1; then \
	  echo "== GPU: cuda backend"; ./$(BIN) parity --model models/tiny-code-moe --backend cuda --presets ref,int4,fp8; \
	  echo; echo "== CPU: exact emulation of every preset"; fi
	./$(BIN) parity --model models/tiny-code-moe

# The layers (docs/ARCHITECTURE.md), make test runs both: no CUDA backend call and no backend-name compare outside
# src/backend; src/cli and src/serve include only the public headers, src/text and src/util
check-layers:
	@tools/check-layers.sh && tools/check-includes.sh

# The house style (.clang-format): format-check is what CI runs, format rewrites the sources.
format:
	@./tools/check-format.sh --fix
format-check:
	@./tools/check-format.sh

clean:
	rm -rf build

help:
	@echo "targets:"
	@echo "  make [all]     build $(LIB), $(BIN) and $(BENCH_BIN) (CUDA sources too when nvcc is found: $(if $(NVCC),$(NVCC),not found))"
	@echo "  make deps      install missing Debian packages (cJSON, PCRE2, cmocka, gnuplot)"
	@echo "  make run       parity table of the presets on models/tiny-code-moe (GPU too when present)"
	@echo "  make test      all tests (unit, golden models vs transformers, CLI, perplexity) and check-layers"
	@echo "  make check-layers  no fm_cuda_* call or backend-name compare outside src/backend; src/cli and src/serve"
	@echo "                 on the public headers (tools/check-layers.sh, tools/check-includes.sh)"
	@echo "  make asan      the tests under ASan + UBSan (build/asan)"
	@echo "  make test-serve  fp8moe serve (ASan build) against the openai npm client, curl and headless Chromium"
	@echo "  make test-gpu  CUDA op tests against the CPU, whole-model GPU parity (needs a GPU)"
	@echo "  make fuzz-run  libFuzzer on the checkpoint parsers for FUZZ_SECONDS (default 60)"
	@echo "  make format    apply .clang-format to every source (make format-check: what CI checks)"
	@echo "  make clean     remove build/"

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
