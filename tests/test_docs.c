/* The documents that describe the code keep up with it: docs/ARCHITECTURE.md names every folder of src/, and the
 * README still starts with the two commands CI and a new user run. (docs/routes.md against the route table:
 * tests/test_routes.c.) Run from the repository root. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* the whole file as a string (the caller frees it) */
static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s (run the tests from the repository root)", path);
    char *text = NULL;
    size_t n = 0;
    FILE *mem = open_memstream(&text, &n);
    assert_non_null(mem);
    char buf[4096];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, f)) > 0) fwrite(buf, 1, got, mem);
    fclose(f);
    fclose(mem);
    return text;
}

static void the_architecture_names_every_source_folder(void **s) {
    (void)s;
    char *doc = read_text("docs/ARCHITECTURE.md");
    DIR *d = opendir("src");
    assert_non_null(d);
    int folders = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char path[512], name[512];
        struct stat st;
        snprintf(path, sizeof path, "src/%s", e->d_name);
        if (stat(path, &st) || !S_ISDIR(st.st_mode)) continue;
        snprintf(name, sizeof name, "`src/%s/`", e->d_name);
        if (!strstr(doc, name)) fail_msg("docs/ARCHITECTURE.md does not name %s: add it to the layers", name);
        folders++;
    }
    closedir(d);
    assert_true(folders >= 10);
    free(doc);
}

static void the_readme_starts_with_run_and_test(void **s) {
    (void)s;
    char *readme = read_text("README.md");
    const char *block = strstr(readme, "```sh\n");
    assert_non_null(block);
    const char *run = strstr(block, "\nmake deps run ");
    const char *test = strstr(block, "\nmake deps test ");
    const char *end = strstr(block + 6, "```");
    if (!run || !test || !end || run > end || test > end)
        fail_msg("README.md's first code block must hold `make deps run` and `make deps test`");
    free(readme);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(the_architecture_names_every_source_folder),
        cmocka_unit_test(the_readme_starts_with_run_and_test),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
