/* fp8moe tokenize / detokenize: text to token ids and back with a model's tokenizer.json (bench tokenize, the encode
 * throughput, is in bench/cli). */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "util/ids.h"
#include "text/tokenizer.h"
#include "util/file.h"
#include "util/status.h"

#define TEXT_MAX_BYTES ((size_t)1 << 32)

static const char *TOKENIZE_HELP =
    "usage: fp8moe tokenize --model DIR (--text STR | --file F) [--out ids.i32] [--no-special] [--text-special]\n"
    "\n"
    "Encodes text with DIR/tokenizer.json (the Hugging Face tokenizers format) as `tokenizers`' encode does and\n"
    "prints the token ids on one line. Special tokens written in the text (<|im_start|>, <s>) become their ids.\n"
    "Invalid UTF-8 in the input is replaced by U+FFFD first.\n"
    "\n"
    "  --model DIR     directory with tokenizer.json (tokenizer_config.json is read when present)\n"
    "  --text STR      the text\n"
    "  --file F        the text from a file (bytes as they are)\n"
    "  --out F         also write the ids as little-endian int32 (the format of generate --prompt-ids)\n"
    "  --no-special    no special tokens from the post-processor (a Llama/Mistral <s>): add_special_tokens=False\n"
    "  --text-special  special tokens written in the text stay text (as for untrusted user input)\n"
    "  -h, --help      this help\n";

static const char *DETOKENIZE_HELP =
    "usage: fp8moe detokenize --model DIR --ids F [--skip-special]\n"
    "\n"
    "Decodes little-endian int32 token ids with DIR/tokenizer.json as `tokenizers`' decode does and prints the text\n"
    "(exactly its bytes; a newline is added only on a terminal).\n"
    "\n"
    "  --model DIR     directory with tokenizer.json\n"
    "  --ids F         the ids file\n"
    "  --skip-special  leave special tokens out\n"
    "  -h, --help      this help\n";

enum { OPT_MODEL = 2000, OPT_TEXT, OPT_FILE, OPT_OUT, OPT_NO_SPECIAL, OPT_TEXT_SPECIAL, OPT_IDS, OPT_SKIP };

typedef struct tok_args {
    const char *model, *text, *file, *out, *ids;
    bool no_special, text_special, skip_special;
} tok_args;

/* Parses argv with the options of one command; -1 when it should run, else the exit code. */
static int parse(const char *cmd, int argc, char **argv, const struct option *opts, const char *help, tok_args *a) {
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'h': return fputs(help, stdout), CLI_OK;
        case OPT_MODEL: a->model = optarg; break;
        case OPT_TEXT: a->text = optarg; break;
        case OPT_FILE: a->file = optarg; break;
        case OPT_OUT: a->out = optarg; break;
        case OPT_IDS: a->ids = optarg; break;
        case OPT_NO_SPECIAL: a->no_special = true; break;
        case OPT_TEXT_SPECIAL: a->text_special = true; break;
        case OPT_SKIP: a->skip_special = true; break;
        default: return cli_usage(cmd, "unknown option or missing value: '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc) return cli_usage(cmd, "unexpected argument '%s'", argv[optind]);
    if (!a->model || !a->model[0]) return cli_usage(cmd, "--model DIR is required (the directory of tokenizer.json)");
    return -1;
}

/* The text of --text or --file. */
static fm_status read_text(const tok_args *a, char **text, size_t *len, fm_error *err) {
    if (a->file) return fm_read_regular(a->file, "a text file", TEXT_MAX_BYTES, text, len, err);
    *len = strlen(a->text);
    *text = strdup(a->text);
    return *text ? FM_OK : fm_fail(err, FM_ERR_NOMEM, "out of memory");
}

int cmd_tokenize(int argc, char **argv) {
    const char *cmd = "tokenize";
    static const struct option opts[] = {{"model", required_argument, 0, OPT_MODEL},
                                         {"text", required_argument, 0, OPT_TEXT},
                                         {"file", required_argument, 0, OPT_FILE},
                                         {"out", required_argument, 0, OPT_OUT},
                                         {"no-special", no_argument, 0, OPT_NO_SPECIAL},
                                         {"text-special", no_argument, 0, OPT_TEXT_SPECIAL},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    tok_args a = {0};
    int rc = parse(cmd, argc, argv, opts, TOKENIZE_HELP, &a);
    if (rc >= 0) return rc;
    if (!a.text == !a.file) return cli_usage(cmd, "give the text with exactly one of --text STR and --file F");
    fm_error err = {{0}};
    fm_tokenizer *t = NULL;
    char *text = NULL;
    size_t len = 0;
    int32_t *ids = NULL;
    int64_t n = 0;
    fm_status st = fm_tokenizer_load(a.model, &t, &err);
    if (!st) st = read_text(&a, &text, &len, &err);
    if (!st) st = fm_tokenizer_encode(t, text, len, !a.no_special, !a.text_special, &ids, &n, &err);
    if (!st && a.out) {
        uint8_t *le = malloc((size_t)n * 4 + 1);
        if (!le) st = fm_fail(&err, FM_ERR_NOMEM, "out of memory");
        for (int64_t i = 0; le && i < n; i++)
            for (int k = 0; k < 4; k++) le[4 * i + k] = (uint8_t)((uint32_t)ids[i] >> (8 * k));
        if (le) st = cli_write_file(a.out, le, (size_t)n * 4, &err);
        free(le);
    }
    if (!st) {
        for (int64_t i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
        printf("\n");
    }
    free(ids), free(text);
    fm_tokenizer_free(t);
    return st ? cli_fail(cmd, st, &err) : CLI_OK;
}

int cmd_detokenize(int argc, char **argv) {
    const char *cmd = "detokenize";
    static const struct option opts[] = {{"model", required_argument, 0, OPT_MODEL},
                                         {"ids", required_argument, 0, OPT_IDS},
                                         {"skip-special", no_argument, 0, OPT_SKIP},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    tok_args a = {0};
    int rc = parse(cmd, argc, argv, opts, DETOKENIZE_HELP, &a);
    if (rc >= 0) return rc;
    if (!a.ids) return cli_usage(cmd, "--ids F is required (little-endian int32 token ids)");
    fm_error err = {{0}};
    fm_tokenizer *t = NULL;
    int32_t *ids = NULL;
    int64_t n = 0;
    char *text = NULL;
    size_t len = 0;
    fm_status st = fm_tokenizer_load(a.model, &t, &err);
    if (!st) st = fm_ids_read(a.ids, &ids, &n, &err);
    if (!st) st = fm_ids_check_vocab(a.ids, ids, n, fm_tokenizer_vocab_size(t), &err);
    if (!st) st = fm_tokenizer_decode(t, ids, n, a.skip_special, &text, &len, &err);
    if (!st) {
        fwrite(text, 1, len, stdout);
        if (isatty(STDOUT_FILENO)) putchar('\n');
    }
    free(ids), free(text);
    fm_tokenizer_free(t);
    return st ? cli_fail(cmd, st, &err) : CLI_OK;
}
