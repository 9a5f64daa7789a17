#!/usr/bin/env bash
# Installs the Debian packages fp8moe builds against (and gnuplot, for parity --plot), when they are missing.
set -eu
need=()
dpkg -s libcjson-dev >/dev/null 2>&1 || need+=(libcjson-dev)
dpkg -s libpcre2-dev >/dev/null 2>&1 || need+=(libpcre2-dev) # checkpoint regexes (compressed-tensors ignore)
dpkg -s libutf8proc-dev >/dev/null 2>&1 || need+=(libutf8proc-dev) # tokenizer: NFC normalization
dpkg -s libcmocka-dev >/dev/null 2>&1 || need+=(libcmocka-dev)
dpkg -s libmicrohttpd-dev >/dev/null 2>&1 || need+=(libmicrohttpd-dev) # fp8moe serve: the HTTP server
dpkg -s python3-jsonschema >/dev/null 2>&1 || need+=(python3-jsonschema) # structured-output tests: the validator
command -v node >/dev/null 2>&1 || need+=(nodejs)       # tests/serve: the openai npm client, puppeteer-core
command -v npm >/dev/null 2>&1 || need+=(npm)
command -v curl >/dev/null 2>&1 || need+=(curl)         # tests/serve: SSE framing
command -v chromium >/dev/null 2>&1 || need+=(chromium) # tests/serve: the chat page in headless Chromium
command -v clang-format >/dev/null 2>&1 || need+=(clang-format) # make format-check (CI)
dpkg -s python3-jinja2 >/dev/null 2>&1 || need+=(python3-jinja2) # test_chat_template: jinja2 is the Jinja oracle
command -v gnuplot >/dev/null 2>&1 || need+=(gnuplot-nox) # parity --plot (without it the plot is skipped, said in one line)
if [ ${#need[@]} -eq 0 ]; then echo "deps: all present"; exit 0; fi
sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
echo "deps: installing ${need[*]}"
$sudo apt-get install -y "${need[@]}" >/dev/null 2>&1 || { $sudo apt-get update >/dev/null && $sudo apt-get install -y "${need[@]}"; }
