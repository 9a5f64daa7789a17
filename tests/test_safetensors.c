/* safetensors reader: round trips and every kind of bad input (each asserts the status and a key part of the
 * message), single files and sharded checkpoints, and a real committed checkpoint. Test files are built
 * byte by byte in a fresh directory under /tmp that is removed after each test. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/safetensors.h"

static char g_dir[64];

static int setup(void **state) {
    (void)state;
    strcpy(g_dir, "/tmp/fm_st_test_XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

/* Removes g_dir and everything in it (one level of subdirectories, which is all the tests make). */
static void remove_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        char p[512];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        struct stat sb;
        if (lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode)) {
            remove_tree(p);
        } else {
            unlink(p);
        }
    }
    closedir(d);
    rmdir(dir);
}

static int teardown(void **state) {
    (void)state;
    remove_tree(g_dir);
    return 0;
}

static void path_of(char *out, size_t cap, const char *name) { snprintf(out, cap, "%s/%s", g_dir, name); }

static void write_bytes(const char *name, const void *data, size_t n) {
    char p[256];
    path_of(p, sizeof p, name);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    if (n) assert_int_equal(fwrite(data, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

static void write_text(const char *name, const char *text) { write_bytes(name, text, strlen(text)); }

/* A safetensors file: the u64 LE header length hlen (which may lie), header_bytes of header, then data. */
static void write_st_raw(const char *name, uint64_t hlen, const char *header, size_t header_bytes, const void *data,
                         size_t data_len) {
    size_t n = 8 + header_bytes + data_len;
    uint8_t *buf = malloc(n);
    assert_non_null(buf);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(hlen >> (8 * i));
    memcpy(buf + 8, header, header_bytes);
    if (data_len) memcpy(buf + 8 + header_bytes, data, data_len);
    write_bytes(name, buf, n);
    free(buf);
}

static void write_st(const char *name, const char *header, const void *data, size_t data_len) {
    write_st_raw(name, strlen(header), header, strlen(header), data, data_len);
}

/* A zero-filled data region of n bytes. */
static uint8_t g_zeros[4096];

/* Builder for valid files: tensors laid out contiguously in the order given. */
typedef struct spec {
    const char *name;
    const char *dtype;
    const char *shape; /* JSON array text */
    const void *bytes;
    size_t n;
} spec;

/* Writes a valid file from specs; pad extra spaces after the JSON (to misalign the data on purpose). */
static void write_valid(const char *fname, const spec *s, int n, const char *metadata, int pad) {
    char header[8192];
    size_t h = 0;
    uint8_t data[8192];
    size_t off = 0;
    h += (size_t)snprintf(header + h, sizeof header - h, "{");
    if (metadata) h += (size_t)snprintf(header + h, sizeof header - h, "\"__metadata__\":%s%s", metadata, n ? "," : "");
    for (int i = 0; i < n; i++) {
        h += (size_t)snprintf(header + h, sizeof header - h,
                              "%s\"%s\":{\"dtype\":\"%s\",\"shape\":%s,\"data_offsets\":[%zu,%zu]}", i ? "," : "",
                              s[i].name, s[i].dtype, s[i].shape, off, off + s[i].n);
        assert_true(off + s[i].n <= sizeof data);
        if (s[i].n) memcpy(data + off, s[i].bytes, s[i].n);
        off += s[i].n;
    }
    h += (size_t)snprintf(header + h, sizeof header - h, "}");
    for (int i = 0; i < pad; i++) header[h++] = ' ';
    header[h] = '\0';
    write_st_raw(fname, h, header, h, data, off);
}

/* Asserts that the message is one line, contains every string in the NULL-terminated list. */
static void assert_msg(const fm_error *err, ...) {
    assert_null(strchr(err->msg, '\n'));
    va_list ap;
    va_start(ap, err);
    const char *s;
    while ((s = va_arg(ap, const char *))) {
        if (!strstr(err->msg, s)) {
            print_error("message \"%s\" lacks \"%s\"\n", err->msg, s);
            va_end(ap);
            fail();
        }
    }
    va_end(ap);
}

/* Opens g_dir/fname, expects status st; the message must name the file and contain the extra strings. */
#define EXPECT_FILE_FAIL(fname, st, ...)                                                                               \
    do {                                                                                                               \
        char p_[256];                                                                                                  \
        fm_st_file f_;                                                                                                 \
        fm_error e_ = {{0}};                                                                                           \
        path_of(p_, sizeof p_, fname);                                                                                 \
        fm_status r_ = fm_st_open_file(p_, &f_, &e_);                                                                  \
        if (r_ != (st)) print_error("status %d, message: %s\n", r_, e_.msg);                                           \
        assert_int_equal(r_, (st));                                                                                    \
        assert_null(f_.tensors);                                                                                       \
        assert_null(f_.map);                                                                                           \
        assert_null(f_.path);                                                                                          \
        assert_msg(&e_, fname, __VA_ARGS__, (const char *)NULL);                                                       \
    } while (0)

#define EXPECT_DIR_FAIL(st, ...)                                                                                       \
    do {                                                                                                               \
        fm_st_set s_;                                                                                                  \
        fm_error e_ = {{0}};                                                                                           \
        fm_status r_ = fm_st_open_dir(g_dir, &s_, &e_);                                                                \
        if (r_ != (st)) print_error("status %d, message: %s\n", r_, e_.msg);                                           \
        assert_int_equal(r_, (st));                                                                                    \
        assert_null(s_.files);                                                                                         \
        assert_null(s_.by_name);                                                                                       \
        assert_int_equal(s_.n_files, 0);                                                                               \
        assert_msg(&e_, __VA_ARGS__, (const char *)NULL);                                                              \
    } while (0)

static void assert_f32_bits(float got, float want) {
    uint32_t a, b;
    memcpy(&a, &got, 4);
    memcpy(&b, &want, 4);
    if (a != b) {
        print_error("got %.9g (0x%08x), want %.9g (0x%08x)\n", got, a, want, b);
        fail();
    }
}

/* ---- valid files ---------------------------------------------------------------------------------- */

static const float k_f32[6] = {1.5f, -2.25f, 0.0f, 3.4028235e38f, 1e-45f, -0.0f};
static const uint16_t k_bf16[4] = {0x3F80, 0xC040, 0x0001, 0x7F80};
static const uint16_t k_f16[4] = {0x3C00, 0xC000, 0x0001, 0x7BFF};
static const uint8_t k_e4m3[6] = {0x38, 0xB8, 0x7E, 0x01, 0x00, 0x7F};
static const int32_t k_i32[2] = {7, -9};
static const uint8_t k_u8[3] = {1, 2, 255};
static const float k_scalar = 42.0f;

/* Little-endian bytes of the constants above (the format's byte order, whatever the host's). */
static void le16(uint8_t *out, const uint16_t *v, int n) {
    for (int i = 0; i < n; i++) {
        out[2 * i] = (uint8_t)v[i];
        out[2 * i + 1] = (uint8_t)(v[i] >> 8);
    }
}
static void le32(uint8_t *out, const void *v, int n) {
    for (int i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, (const uint8_t *)v + 4 * i, 4);
        for (int k = 0; k < 4; k++) out[4 * i + k] = (uint8_t)(u >> (8 * k));
    }
}

static uint8_t b_f32[24], b_bf16[8], b_f16[8], b_i32[8], b_scalar[4];

static int make_all_dtypes(const char *fname, int pad) {
    le32(b_f32, k_f32, 6);
    le16(b_bf16, k_bf16, 4);
    le16(b_f16, k_f16, 4);
    le32(b_i32, k_i32, 2);
    le32(b_scalar, &k_scalar, 1);
    /* sizes 24, 8, 8, 6, 8, 3, 0, 4: after the 1-byte tensors, the 4-byte ones start misaligned */
    const spec s[] = {
        {"w.f32", "F32", "[2,3]", b_f32, 24}, {"w.bf16", "BF16", "[4]", b_bf16, 8},
        {"w.f16", "F16", "[2,2]", b_f16, 8},  {"w.e4m3", "F8_E4M3", "[6]", k_e4m3, 6},
        {"w.u8", "U8", "[3]", k_u8, 3},       {"w.i32", "I32", "[2]", b_i32, 8},
        {"w.empty", "F32", "[0,5]", NULL, 0}, {"w.scalar", "F32", "[]", b_scalar, 4},
    };
    write_valid(fname, s, (int)(sizeof s / sizeof s[0]), "{\"format\":\"pt\",\"note\":\"x\"}", pad);
    return (int)(sizeof s / sizeof s[0]);
}

static const fm_st_tensor *by_name(const fm_st_file *f, const char *name) {
    for (int64_t i = 0; i < f->n_tensors; i++)
        if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    return NULL;
}

static void check_all_dtypes(const fm_st_tensor *(*find)(const void *, const char *), const void *ctx) {
    fm_error err;
    float v[8];

    const fm_st_tensor *t = find(ctx, "w.f32");
    assert_non_null(t);
    assert_int_equal(t->dtype, FM_DTYPE_F32);
    assert_int_equal(t->n_dims, 2);
    assert_int_equal(t->shape[0], 2);
    assert_int_equal(t->shape[1], 3);
    assert_int_equal(t->n_elements, 6);
    assert_int_equal(t->nbytes, 24);
    assert_int_equal(fm_st_read_f32(t, 0, 6, v, &err), FM_OK);
    for (int i = 0; i < 6; i++) assert_f32_bits(v[i], k_f32[i]);
    assert_int_equal(fm_st_read_f32(t, 4, 2, v, &err), FM_OK); /* a slice */
    assert_f32_bits(v[0], k_f32[4]);
    assert_f32_bits(v[1], k_f32[5]);

    t = find(ctx, "w.bf16");
    assert_non_null(t);
    assert_int_equal(t->dtype, FM_DTYPE_BF16);
    assert_int_equal(fm_st_read_f32(t, 0, 4, v, &err), FM_OK);
    assert_f32_bits(v[0], 1.0f);
    assert_f32_bits(v[1], -3.0f);
    assert_f32_bits(v[2], ldexpf(1.0f, -133));
    assert_f32_bits(v[3], INFINITY);

    t = find(ctx, "w.f16");
    assert_non_null(t);
    assert_int_equal(t->dtype, FM_DTYPE_F16);
    assert_int_equal(t->n_elements, 4);
    assert_int_equal(fm_st_read_f32(t, 0, 4, v, &err), FM_OK);
    assert_f32_bits(v[0], 1.0f);
    assert_f32_bits(v[1], -2.0f);
    assert_f32_bits(v[2], ldexpf(1.0f, -24));
    assert_f32_bits(v[3], 65504.0f);

    t = find(ctx, "w.e4m3");
    assert_non_null(t);
    assert_int_equal(t->dtype, FM_DTYPE_F8_E4M3);
    assert_int_equal(fm_st_read_f32(t, 0, 6, v, &err), FM_OK);
    assert_f32_bits(v[0], 1.0f);
    assert_f32_bits(v[1], -1.0f);
    assert_f32_bits(v[2], 448.0f);
    assert_f32_bits(v[3], ldexpf(1.0f, -9));
    assert_f32_bits(v[4], 0.0f);
    assert_true(isnan(v[5]));

    t = find(ctx, "w.i32");
    assert_non_null(t);
    assert_int_equal(t->dtype, FM_DTYPE_I32);
    int32_t iv[2];
    memcpy(iv, t->data, 8); /* host is little-endian in CI */
    assert_int_equal(iv[0], 7);
    assert_int_equal(iv[1], -9);
    assert_int_equal(fm_st_read_f32(t, 0, 2, v, &err), FM_ERR_UNSUPPORTED);
    assert_msg(&err, "w.i32", "I32", (const char *)NULL);

    t = find(ctx, "w.u8");
    assert_non_null(t);
    assert_int_equal(t->dtype, FM_DTYPE_U8);
    assert_memory_equal(t->data, k_u8, 3);
    assert_int_equal(fm_st_read_f32(t, 0, 1, v, &err), FM_ERR_UNSUPPORTED);

    t = find(ctx, "w.empty");
    assert_non_null(t);
    assert_int_equal(t->n_elements, 0);
    assert_int_equal(t->nbytes, 0);
    assert_int_equal(fm_st_read_f32(t, 0, 0, v, &err), FM_OK);
    assert_int_equal(fm_st_read_f32(t, 0, 1, v, &err), FM_ERR_USAGE);

    t = find(ctx, "w.scalar");
    assert_non_null(t);
    assert_int_equal(t->n_dims, 0);
    assert_int_equal(t->n_elements, 1);
    assert_int_equal(fm_st_read_f32(t, 0, 1, v, &err), FM_OK);
    assert_f32_bits(v[0], 42.0f);

    /* bounds */
    t = find(ctx, "w.f32");
    assert_int_equal(fm_st_read_f32(t, 5, 2, v, &err), FM_ERR_USAGE);
    assert_msg(&err, "w.f32", (const char *)NULL);
    assert_int_equal(fm_st_read_f32(t, -1, 1, v, &err), FM_ERR_USAGE);
    assert_int_equal(fm_st_read_f32(t, 1, INT64_MAX, v, &err), FM_ERR_USAGE);
    assert_int_equal(fm_st_read_f32(t, 7, 0, v, &err), FM_ERR_USAGE);
    assert_int_equal(fm_st_read_f32(t, 6, 0, v, &err), FM_OK);
}

static const fm_st_tensor *find_in_file(const void *ctx, const char *name) { return by_name(ctx, name); }
static const fm_st_tensor *find_in_set(const void *ctx, const char *name) { return fm_st_find(ctx, name); }

static void test_valid_round_trip(void **state) {
    (void)state;
    for (int pad = 0; pad < 4; pad++) { /* the data region starts at every alignment */
        int n = make_all_dtypes("model.safetensors", pad);
        char p[256];
        fm_error err;
        path_of(p, sizeof p, "model.safetensors");

        fm_st_file f;
        assert_int_equal(fm_st_open_file(p, &f, &err), FM_OK);
        assert_int_equal(f.n_tensors, n);
        assert_non_null(f.map);
        assert_string_equal(f.path, p);
        check_all_dtypes(find_in_file, &f);
        fm_st_close_file(&f);
        assert_null(f.tensors);
        fm_st_close_file(&f); /* closing twice is harmless */

        fm_st_set s;
        assert_int_equal(fm_st_open_dir(g_dir, &s, &err), FM_OK);
        assert_int_equal(s.n_files, 1);
        assert_int_equal(s.n_tensors, n);
        for (int64_t i = 1; i < s.n_tensors; i++) assert_true(strcmp(s.by_name[i - 1]->name, s.by_name[i]->name) < 0);
        check_all_dtypes(find_in_set, &s);
        assert_null(fm_st_find(&s, "w.missing"));
        assert_null(fm_st_find(&s, ""));
        fm_st_close(&s);
        fm_st_close(&s);
    }
}

/* In-memory parse (what the fuzzer uses), empty header, and dtype helpers. */
static void test_parse_in_memory(void **state) {
    (void)state;
    uint8_t buf[16] = {2, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
    fm_st_file f;
    fm_error err;
    assert_int_equal(fm_st_parse(buf, 10, "mem", &f, &err), FM_OK);
    assert_int_equal(f.n_tensors, 0);
    assert_null(f.map);
    fm_st_close_file(&f);
    /* header padded with spaces to 8 bytes, as the reference writer does */
    memcpy(buf, (uint8_t[8]){8, 0, 0, 0, 0, 0, 0, 0}, 8);
    memcpy(buf + 8, "{}      ", 8);
    assert_int_equal(fm_st_parse(buf, 16, "mem", &f, &err), FM_OK);
    fm_st_close_file(&f);
    /* NUL padding is rejected, as the reference reader does */
    memcpy(buf + 8, "{}\0\0\0\0\0\0", 8);
    assert_int_equal(fm_st_parse(buf, 16, "mem", &f, &err), FM_ERR_FORMAT);
    assert_msg(&err, "mem", "NUL", (const char *)NULL);

    assert_string_equal(fm_dtype_name(FM_DTYPE_F8_E4M3), "F8_E4M3");
    assert_string_equal(fm_dtype_name(FM_DTYPE_BF16), "BF16");
    assert_int_equal(fm_dtype_size(FM_DTYPE_F32), 4);
    assert_int_equal(fm_dtype_size(FM_DTYPE_BF16), 2);
    assert_int_equal(fm_dtype_size(FM_DTYPE_U8), 1);
    assert_int_equal(fm_dtype_size(FM_DTYPE_COUNT), 0);
}

/* ---- bad single files ----------------------------------------------------------------------------- */

static void test_truncated_file(void **state) {
    (void)state;
    write_bytes("short.safetensors", "\x10\x00\x00\x00\x00", 5);
    EXPECT_FILE_FAIL("short.safetensors", FM_ERR_FORMAT, "5 bytes", "at least 8");

    write_bytes("empty.safetensors", "", 0);
    EXPECT_FILE_FAIL("empty.safetensors", FM_ERR_FORMAT, "empty");

    /* a valid file cut short in its data region: the last tensor runs past the end */
    const char *h = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                    "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}";
    write_st("cut.safetensors", h, g_zeros, 20);
    EXPECT_FILE_FAIL("cut.safetensors", FM_ERR_FORMAT, "'b'", "[8, 24]", "20 bytes");

    /* cut in the middle of the header */
    write_st_raw("cuthdr.safetensors", strlen(h), h, 30, NULL, 0);
    EXPECT_FILE_FAIL("cuthdr.safetensors", FM_ERR_FORMAT, "header length");

    /* a directory and a missing file */
    char p[256];
    path_of(p, sizeof p, "sub.safetensors");
    assert_int_equal(mkdir(p, 0700), 0);
    EXPECT_FILE_FAIL("sub.safetensors", FM_ERR_IO, "directory");
    EXPECT_FILE_FAIL("nothere.safetensors", FM_ERR_IO, "cannot open");
}

static void test_header_beyond_file(void **state) {
    (void)state;
    const char *h = "{}";
    write_st_raw("long.safetensors", 1000, h, 2, g_zeros, 10);
    EXPECT_FILE_FAIL("long.safetensors", FM_ERR_FORMAT, "header length 1000", "12 bytes");
    write_st_raw("long2.safetensors", 3, h, 2, NULL, 0);
    EXPECT_FILE_FAIL("long2.safetensors", FM_ERR_FORMAT, "header length 3", "2 bytes");
}

static void test_header_over_cap(void **state) {
    (void)state;
    const char *h = "{}";
    write_st_raw("cap.safetensors", (uint64_t)FM_ST_MAX_HEADER + 1, h, 2, NULL, 0);
    EXPECT_FILE_FAIL("cap.safetensors", FM_ERR_FORMAT, "100000001", "100000000");
    /* 8 + N would overflow 64 bits */
    write_st_raw("huge.safetensors", UINT64_MAX, h, 2, NULL, 0);
    EXPECT_FILE_FAIL("huge.safetensors", FM_ERR_FORMAT, "18446744073709551615");
    write_st_raw("huge2.safetensors", UINT64_MAX - 7, h, 2, NULL, 0);
    EXPECT_FILE_FAIL("huge2.safetensors", FM_ERR_FORMAT, "header length");
}

static void test_malformed_json(void **state) {
    (void)state;
    write_st("m1.safetensors", "{\"a\":{\"dtype\":\"F32\",", NULL, 0);
    EXPECT_FILE_FAIL("m1.safetensors", FM_ERR_FORMAT, "not valid JSON");
    write_st("m2.safetensors", "{} x", NULL, 0);
    EXPECT_FILE_FAIL("m2.safetensors", FM_ERR_FORMAT, "after the JSON value");
    write_st("m3.safetensors", "", NULL, 0);
    EXPECT_FILE_FAIL("m3.safetensors", FM_ERR_FORMAT, "empty");
    write_st("m4.safetensors", "{\"a\\", NULL, 0); /* ends inside an escape */
    EXPECT_FILE_FAIL("m4.safetensors", FM_ERR_FORMAT, "JSON");
    write_st("m5.safetensors", "{\"\xff\":1}", NULL, 0);
    EXPECT_FILE_FAIL("m5.safetensors", FM_ERR_FORMAT, "UTF-8");
    write_st("m6.safetensors", "{\"a\\u0000b\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}", NULL, 0);
    EXPECT_FILE_FAIL("m6.safetensors", FM_ERR_FORMAT, "u0000");
}

static void test_non_object_header(void **state) {
    (void)state;
    write_st("n1.safetensors", "[1,2]", NULL, 0);
    EXPECT_FILE_FAIL("n1.safetensors", FM_ERR_FORMAT, "object");
    write_st("n2.safetensors", "\"str\"", NULL, 0);
    EXPECT_FILE_FAIL("n2.safetensors", FM_ERR_FORMAT, "object");
    write_st("n3.safetensors", "{\"a\":[1]}", NULL, 0);
    EXPECT_FILE_FAIL("n3.safetensors", FM_ERR_FORMAT, "'a'", "not a JSON object");
    write_st("n4.safetensors", "{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0],\"extra\":1}}", NULL, 0);
    EXPECT_FILE_FAIL("n4.safetensors", FM_ERR_FORMAT, "'a'", "extra");
    write_st("n5.safetensors", "{\"a\":{\"dtype\":\"F32\",\"shape\":[0]}}", NULL, 0);
    EXPECT_FILE_FAIL("n5.safetensors", FM_ERR_FORMAT, "'a'", "data_offsets");
    write_st("n6.safetensors", "{\"a\":{\"dtype\":5,\"shape\":[0],\"data_offsets\":[0,0]}}", NULL, 0);
    EXPECT_FILE_FAIL("n6.safetensors", FM_ERR_FORMAT, "'a'", "dtype");
    write_st("n7.safetensors", "{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}",
             NULL, 0);
    EXPECT_FILE_FAIL("n7.safetensors", FM_ERR_FORMAT, "'a'", "twice");
    write_st("n8.safetensors", "{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0]}}", NULL, 0);
    EXPECT_FILE_FAIL("n8.safetensors", FM_ERR_FORMAT, "'a'", "data_offsets");
}

static void test_unknown_dtype(void **state) {
    (void)state;
    write_st("d1.safetensors", "{\"wf\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}", g_zeros, 8);
    EXPECT_FILE_FAIL("d1.safetensors", FM_ERR_UNSUPPORTED, "'wf'", "'F64'", "F32 F16 BF16 F8_E4M3 I32 U8");
    write_st("d2.safetensors", "{\"wi\":{\"dtype\":\"U64\",\"shape\":[1],\"data_offsets\":[0,8]}}", g_zeros, 8);
    EXPECT_FILE_FAIL("d2.safetensors", FM_ERR_UNSUPPORTED, "'wi'", "'U64'", "BF16");
    write_st("d3.safetensors", "{\"wx\":{\"dtype\":\"FLOAT7\",\"shape\":[1],\"data_offsets\":[0,1]}}", g_zeros, 1);
    EXPECT_FILE_FAIL("d3.safetensors", FM_ERR_FORMAT, "'wx'", "'FLOAT7'", "F8_E4M3");
    write_st("d4.safetensors", "{\"wl\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", g_zeros, 4);
    EXPECT_FILE_FAIL("d4.safetensors", FM_ERR_FORMAT, "'wl'", "'f32'");
}

static void test_bad_shape(void **state) {
    (void)state;
    write_st("s1.safetensors", "{\"neg\":{\"dtype\":\"F32\",\"shape\":[-1,2],\"data_offsets\":[0,8]}}", g_zeros, 8);
    EXPECT_FILE_FAIL("s1.safetensors", FM_ERR_FORMAT, "'neg'", "shape[0]", "-1", "negative");
    write_st("s2.safetensors", "{\"frac\":{\"dtype\":\"F32\",\"shape\":[2,1.5],\"data_offsets\":[0,12]}}", g_zeros, 12);
    EXPECT_FILE_FAIL("s2.safetensors", FM_ERR_FORMAT, "'frac'", "shape[1]", "1.5", "not an integer");
    write_st("s3.safetensors", "{\"deep\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}",
             g_zeros, 1);
    EXPECT_FILE_FAIL("s3.safetensors", FM_ERR_UNSUPPORTED, "'deep'", "9 dimensions", "8");
    write_st("s4.safetensors", "{\"str\":{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,8]}}", g_zeros, 8);
    EXPECT_FILE_FAIL("s4.safetensors", FM_ERR_FORMAT, "'str'", "shape[0]", "not a number");
    write_st("s5.safetensors", "{\"big\":{\"dtype\":\"F32\",\"shape\":[1e300],\"data_offsets\":[0,8]}}", g_zeros, 8);
    EXPECT_FILE_FAIL("s5.safetensors", FM_ERR_FORMAT, "'big'", "too large");
    write_st("s6.safetensors", "{\"ovf\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]}}",
             g_zeros, 8);
    EXPECT_FILE_FAIL("s6.safetensors", FM_ERR_FORMAT, "'ovf'", "overflow");
    /* element count fits in 64 bits, bytes (x4) do not */
    write_st("s7.safetensors", "{\"ovb\":{\"dtype\":\"F32\",\"shape\":[2147483648,2147483648],\"data_offsets\":[0,8]}}",
             g_zeros, 8);
    EXPECT_FILE_FAIL("s7.safetensors", FM_ERR_FORMAT, "'ovb'", "overflow");
    write_st("s8.safetensors", "{\"obj\":{\"dtype\":\"F32\",\"shape\":{},\"data_offsets\":[0,8]}}", g_zeros, 8);
    EXPECT_FILE_FAIL("s8.safetensors", FM_ERR_FORMAT, "'obj'", "shape");
}

static void test_offsets_outside(void **state) {
    (void)state;
    write_st("o1.safetensors", "{\"far\":{\"dtype\":\"U8\",\"shape\":[1000],\"data_offsets\":[0,1000]}}", g_zeros, 24);
    EXPECT_FILE_FAIL("o1.safetensors", FM_ERR_FORMAT, "'far'", "1000", "24 bytes");
    write_st("o2.safetensors", "{\"nb\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[-4,0]}}", g_zeros, 4);
    EXPECT_FILE_FAIL("o2.safetensors", FM_ERR_FORMAT, "'nb'", "begin", "negative");
    write_st("o3.safetensors", "{\"rev\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[4,0]}}", g_zeros, 4);
    EXPECT_FILE_FAIL("o3.safetensors", FM_ERR_FORMAT, "'rev'", "4", "0");
    write_st("o4.safetensors",
             "{\"huge\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[18446744073709551612,18446744073709551616]}}",
             g_zeros, 4);
    EXPECT_FILE_FAIL("o4.safetensors", FM_ERR_FORMAT, "'huge'", "too large");
}

static void test_overlapping_offsets(void **state) {
    (void)state;
    write_st("ov.safetensors",
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
             g_zeros, 12);
    EXPECT_FILE_FAIL("ov.safetensors", FM_ERR_FORMAT, "'b'", "'a'", "overlap of 4 bytes");
    /* aliasing: two tensors on the same bytes */
    write_st("al.safetensors",
             "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"y\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
             g_zeros, 8);
    EXPECT_FILE_FAIL("al.safetensors", FM_ERR_FORMAT, "'y'", "'x'", "overlap of 8 bytes");
}

static void test_gap(void **state) {
    (void)state;
    write_st("gap.safetensors",
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}",
             g_zeros, 20);
    EXPECT_FILE_FAIL("gap.safetensors", FM_ERR_FORMAT, "'b'", "'a'", "gap of 4 bytes");
    /* the first tensor not at 0 */
    write_st("gap0.safetensors", "{\"late\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", g_zeros, 12);
    EXPECT_FILE_FAIL("gap0.safetensors", FM_ERR_FORMAT, "'late'", "starts at 4", "expected 0");
}

static void test_trailing_bytes(void **state) {
    (void)state;
    write_st("tr.safetensors", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", g_zeros, 12);
    EXPECT_FILE_FAIL("tr.safetensors", FM_ERR_FORMAT, "12 bytes", "cover 8", "4 trailing");
    write_st("tr0.safetensors", "{}", g_zeros, 3);
    EXPECT_FILE_FAIL("tr0.safetensors", FM_ERR_FORMAT, "3 trailing");
}

static void test_byte_length_mismatch(void **state) {
    (void)state;
    write_st("bl.safetensors", "{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", g_zeros, 8);
    EXPECT_FILE_FAIL("bl.safetensors", FM_ERR_FORMAT, "'w'", "hold 8 bytes", "needs 12");
    write_st("bl2.safetensors", "{\"h\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[0,4]}}", g_zeros, 4);
    EXPECT_FILE_FAIL("bl2.safetensors", FM_ERR_FORMAT, "'h'", "BF16", "needs 8");
}

static void test_duplicate_names(void **state) {
    (void)state;
    write_st("dup.safetensors",
             "{\"twin\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
             "\"twin\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
             g_zeros, 8);
    EXPECT_FILE_FAIL("dup.safetensors", FM_ERR_FORMAT, "'twin'", "twice");
}

static void test_bad_metadata(void **state) {
    (void)state;
    write_st("md1.safetensors", "{\"__metadata__\":{\"format\":1}}", NULL, 0);
    EXPECT_FILE_FAIL("md1.safetensors", FM_ERR_FORMAT, "__metadata__", "'format'", "not a string");
    write_st("md2.safetensors", "{\"__metadata__\":[\"pt\"]}", NULL, 0);
    EXPECT_FILE_FAIL("md2.safetensors", FM_ERR_FORMAT, "__metadata__", "object");
    write_st("md3.safetensors", "{\"__metadata__\":{},\"__metadata__\":{}}", NULL, 0);
    EXPECT_FILE_FAIL("md3.safetensors", FM_ERR_FORMAT, "__metadata__", "twice");
    write_st("md4.safetensors", "{\"__metadata__\":{\"k\":\"a\",\"k\":\"b\"}}", NULL, 0);
    EXPECT_FILE_FAIL("md4.safetensors", FM_ERR_FORMAT, "__metadata__", "'k'", "twice");
    write_st("md5.safetensors", "{\"__metadata__\":{\"format\":{\"x\":\"y\"}}}", NULL, 0);
    EXPECT_FILE_FAIL("md5.safetensors", FM_ERR_FORMAT, "__metadata__", "format");
}

/* ---- sharded checkpoints -------------------------------------------------------------------------- */

static const float k_s1a[2] = {1.0f, 2.0f}, k_s1b[3] = {3.0f, 4.0f, 5.0f}, k_s2c[1] = {-6.5f};

static void write_shards(void) {
    uint8_t a[8], b[12], c[4];
    le32(a, k_s1a, 2);
    le32(b, k_s1b, 3);
    le32(c, k_s2c, 1);
    const spec s1[] = {{"t.a", "F32", "[2]", a, 8}, {"t.b", "F32", "[3,1]", b, 12}};
    const spec s2[] = {{"t.c", "F32", "[1]", c, 4}};
    write_valid("model-00001-of-00002.safetensors", s1, 2, "{\"format\":\"pt\"}", 0);
    write_valid("model-00002-of-00002.safetensors", s2, 1, NULL, 3);
}

#define GOOD_INDEX                                                                                                     \
    "{\"metadata\":{\"total_size\":24},\"weight_map\":{\"t.a\":\"model-00001-of-00002.safetensors\","                  \
    "\"t.c\":\"model-00002-of-00002.safetensors\",\"t.b\":\"model-00001-of-00002.safetensors\"}}"

static void test_sharded_valid(void **state) {
    (void)state;
    write_shards();
    write_text("model.safetensors.index.json", GOOD_INDEX);
    /* also a model.safetensors that must be ignored in favour of the index */
    write_st("model.safetensors", "{}", NULL, 0);
    fm_st_set s;
    fm_error err = {{0}};
    fm_status st = fm_st_open_dir(g_dir, &s, &err);
    if (st != FM_OK) print_error("%s\n", err.msg);
    assert_int_equal(st, FM_OK);
    assert_int_equal(s.n_files, 2);
    assert_int_equal(s.n_tensors, 3);
    const char *names[3] = {"t.a", "t.b", "t.c"};
    for (int i = 0; i < 3; i++) assert_string_equal(s.by_name[i]->name, names[i]);
    const fm_st_tensor *a = fm_st_find(&s, "t.a"), *b = fm_st_find(&s, "t.b"), *c = fm_st_find(&s, "t.c");
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(c);
    assert_int_equal(a->file, b->file);
    assert_int_not_equal(a->file, c->file);
    assert_non_null(strstr(s.files[a->file].path, "model-00001-of-00002.safetensors"));
    assert_non_null(strstr(s.files[c->file].path, "model-00002-of-00002.safetensors"));
    assert_int_equal(b->n_dims, 2);
    assert_int_equal(b->shape[0], 3);
    float v[3];
    assert_int_equal(fm_st_read_f32(b, 0, 3, v, &err), FM_OK);
    for (int i = 0; i < 3; i++) assert_f32_bits(v[i], k_s1b[i]);
    assert_int_equal(fm_st_read_f32(c, 0, 1, v, &err), FM_OK);
    assert_f32_bits(v[0], -6.5f);
    assert_null(fm_st_find(&s, "t.d"));
    fm_st_close(&s);

    /* the index parser on its own: distinct shard names */
    char **sh = NULL;
    int32_t n = 0;
    assert_int_equal(fm_st_parse_index(GOOD_INDEX, strlen(GOOD_INDEX), "idx", &sh, &n, &err), FM_OK);
    assert_int_equal(n, 2);
    assert_string_equal(sh[0], "model-00001-of-00002.safetensors");
    assert_string_equal(sh[1], "model-00002-of-00002.safetensors");
    for (int i = 0; i < n; i++) free(sh[i]);
    free(sh);
}

static void test_sharded_missing_shard_file(void **state) {
    (void)state;
    write_shards();
    write_text(
        "model.safetensors.index.json",
        "{\"weight_map\":{\"t.a\":\"model-00001-of-00002.safetensors\",\"t.b\":\"model-00001-of-00002.safetensors\","
        "\"t.c\":\"model-00003-of-00002.safetensors\"}}");
    EXPECT_DIR_FAIL(FM_ERR_IO, "model.safetensors.index.json", "model-00003-of-00002.safetensors", "No such file");
}

static void test_sharded_tensor_not_in_shard(void **state) {
    (void)state;
    write_shards();
    write_text(
        "model.safetensors.index.json",
        "{\"weight_map\":{\"t.a\":\"model-00001-of-00002.safetensors\",\"t.b\":\"model-00001-of-00002.safetensors\","
        "\"t.c\":\"model-00002-of-00002.safetensors\",\"t.ghost\":\"model-00002-of-00002.safetensors\"}}");
    EXPECT_DIR_FAIL(FM_ERR_FORMAT, "model.safetensors.index.json", "'t.ghost'", "model-00002-of-00002.safetensors",
                    "no such tensor");
    /* mapped to the other shard than the one holding it */
    write_text(
        "model.safetensors.index.json",
        "{\"weight_map\":{\"t.a\":\"model-00001-of-00002.safetensors\",\"t.b\":\"model-00002-of-00002.safetensors\","
        "\"t.c\":\"model-00002-of-00002.safetensors\"}}");
    EXPECT_DIR_FAIL(FM_ERR_FORMAT, "'t.b'", "model-00002-of-00002.safetensors",
                    "but it is in shard 'model-00001-of-00002.safetensors'");
}

static void test_sharded_tensor_missing_from_map(void **state) {
    (void)state;
    write_shards();
    write_text(
        "model.safetensors.index.json",
        "{\"weight_map\":{\"t.a\":\"model-00001-of-00002.safetensors\",\"t.c\":\"model-00002-of-00002.safetensors\"}}");
    EXPECT_DIR_FAIL(FM_ERR_FORMAT, "model.safetensors.index.json", "'t.b'", "model-00001-of-00002.safetensors",
                    "missing from the weight_map");
}

static void test_sharded_tensor_in_two_shards(void **state) {
    (void)state;
    write_shards();
    uint8_t b[4] = {0};
    const spec s3[] = {{"t.a", "F32", "[1]", b, 4}};
    write_valid("model-00003-of-00003.safetensors", s3, 1, NULL, 0);
    write_text(
        "model.safetensors.index.json",
        "{\"weight_map\":{\"t.a\":\"model-00001-of-00002.safetensors\",\"t.b\":\"model-00001-of-00002.safetensors\","
        "\"t.c\":\"model-00002-of-00002.safetensors\",\"t.x\":\"model-00003-of-00003.safetensors\"}}");
    EXPECT_DIR_FAIL(FM_ERR_FORMAT, "'t.a'", "two shards", "model-00001-of-00002.safetensors",
                    "model-00003-of-00003.safetensors");
}

static void test_sharded_bad_shard_name(void **state) {
    (void)state;
    write_shards();
    write_text("model.safetensors.index.json", "{\"weight_map\":{\"t.a\":\"../model-00001-of-00002.safetensors\"}}");
    EXPECT_DIR_FAIL(FM_ERR_FORMAT, "model.safetensors.index.json", "'t.a'", "../model-00001-of-00002.safetensors",
                    "'/'");

    fm_error err;
    char **sh = (char **)&err; /* must be reset to NULL on failure */
    int32_t n = 7;
    const char *bad[] = {
        "{\"weight_map\":{\"w\":\"sub/x.safetensors\"}}",
        "{\"weight_map\":{\"w\":\"..\"}}",
        "{\"weight_map\":{\"w\":\"x.bin\"}}",
        "{\"weight_map\":{\"w\":\".safetensors\"}}",
        "{\"weight_map\":{\"w\":\"/etc/x.safetensors\"}}",
        "{\"weight_map\":{\"w\":3}}",
        "{\"weight_map\":[]}",
        "{\"weight_map\":{}}",
        "{\"metadata\":{}}",
        "{\"weight_map\":{\"w\":\"a.safetensors\",\"w\":\"a.safetensors\"}}",
        "{\"weight_map\":{},\"weight_map\":{}}",
        "[]",
        "{\"weight_map\":{\"w\":\"a.safetensors\"}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(fm_st_parse_index(bad[i], strlen(bad[i]), "the-index", &sh, &n, &err), FM_ERR_FORMAT);
        assert_null(sh);
        assert_int_equal(n, 0);
        assert_msg(&err, "the-index", (const char *)NULL);
    }
}

static void test_neither_file(void **state) {
    (void)state;
    write_text("config.json", "{}");
    EXPECT_DIR_FAIL(FM_ERR_IO, g_dir, "model.safetensors.index.json", "model.safetensors", "neither");
    /* not a directory at all */
    fm_st_set s;
    fm_error err;
    char p[256];
    path_of(p, sizeof p, "config.json");
    assert_int_equal(fm_st_open_dir(p, &s, &err), FM_ERR_IO);
    assert_msg(&err, "config.json", "not a directory", (const char *)NULL);
    path_of(p, sizeof p, "nope");
    assert_int_equal(fm_st_open_dir(p, &s, &err), FM_ERR_IO);
    assert_msg(&err, "nope", (const char *)NULL);
}

/* A bad shard's own error comes through with the index and the shard named. */
static void test_sharded_bad_shard_content(void **state) {
    (void)state;
    write_shards();
    write_st("model-00002-of-00002.safetensors", "{\"t.c\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}",
             g_zeros, 8);
    write_text("model.safetensors.index.json", GOOD_INDEX);
    EXPECT_DIR_FAIL(FM_ERR_UNSUPPORTED, "model.safetensors.index.json", "model-00002-of-00002.safetensors", "'t.c'",
                    "F64");
    write_text("model.safetensors.index.json", "{\"weight_map\":");
    EXPECT_DIR_FAIL(FM_ERR_FORMAT, "model.safetensors.index.json", "JSON");
}

/* ---- a real checkpoint (made by transformers, committed under tests/models) ------------------------- */

static void test_real_mixtral_sharded(void **state) {
    (void)state;
    const char *dir = getenv("FM_TEST_MIXTRAL_DIR"); /* override for running outside the repository */
    if (!dir) dir = "tests/models/mixtral-f32-sharded";
    fm_st_set s;
    fm_error err = {{0}};
    fm_status st = fm_st_open_dir(dir, &s, &err);
    if (st != FM_OK) print_error("%s\n", err.msg);
    assert_int_equal(st, FM_OK);
    assert_int_equal(s.n_files, 5);
    /* 2 layers x (4 attention + 2 norms + router + 8 experts x 3) + embed + final norm + lm_head */
    assert_int_equal(s.n_tensors, 65);
    struct {
        const char *name;
        int64_t d0, d1;
    } want[] = {
        {"model.embed_tokens.weight", 300, 64},
        {"lm_head.weight", 300, 64},
        {"model.norm.weight", 64, -1},
        {"model.layers.0.self_attn.q_proj.weight", 64, 64},
        {"model.layers.0.self_attn.k_proj.weight", 32, 64},
        {"model.layers.1.self_attn.v_proj.weight", 32, 64},
        {"model.layers.1.self_attn.o_proj.weight", 64, 64},
        {"model.layers.0.block_sparse_moe.gate.weight", 8, 64},
        {"model.layers.1.block_sparse_moe.experts.7.w1.weight", 96, 64},
        {"model.layers.1.block_sparse_moe.experts.7.w2.weight", 64, 96},
        {"model.layers.0.block_sparse_moe.experts.3.w3.weight", 96, 64},
        {"model.layers.1.post_attention_layernorm.weight", 64, -1},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const fm_st_tensor *t = fm_st_find(&s, want[i].name);
        if (!t) print_error("missing %s\n", want[i].name);
        assert_non_null(t);
        assert_int_equal(t->dtype, FM_DTYPE_F32);
        assert_int_equal(t->n_dims, want[i].d1 < 0 ? 1 : 2);
        assert_int_equal(t->shape[0], want[i].d0);
        if (want[i].d1 >= 0) assert_int_equal(t->shape[1], want[i].d1);
    }
    const fm_st_tensor *e = fm_st_find(&s, "model.embed_tokens.weight");
    float *v = malloc(300 * 64 * sizeof *v);
    assert_non_null(v);
    assert_int_equal(fm_st_read_f32(e, 0, 300 * 64, v, &err), FM_OK);
    double sum_sq = 0;
    for (int i = 0; i < 300 * 64; i++) {
        assert_true(isfinite(v[i]));
        sum_sq += (double)v[i] * v[i];
    }
    assert_true(sum_sq > 0); /* trained or initialised weights, not zeros */
    free(v);
    int64_t per_file = 0;
    for (int32_t i = 0; i < s.n_files; i++) per_file += s.files[i].n_tensors;
    assert_int_equal(per_file, 65);
    fm_st_close(&s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_valid_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_parse_in_memory, setup, teardown),
        cmocka_unit_test_setup_teardown(test_truncated_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_header_beyond_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_header_over_cap, setup, teardown),
        cmocka_unit_test_setup_teardown(test_malformed_json, setup, teardown),
        cmocka_unit_test_setup_teardown(test_non_object_header, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unknown_dtype, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_shape, setup, teardown),
        cmocka_unit_test_setup_teardown(test_offsets_outside, setup, teardown),
        cmocka_unit_test_setup_teardown(test_overlapping_offsets, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gap, setup, teardown),
        cmocka_unit_test_setup_teardown(test_trailing_bytes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_byte_length_mismatch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_duplicate_names, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_metadata, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sharded_valid, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sharded_missing_shard_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sharded_tensor_not_in_shard, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sharded_tensor_missing_from_map, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sharded_tensor_in_two_shards, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sharded_bad_shard_name, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sharded_bad_shard_content, setup, teardown),
        cmocka_unit_test_setup_teardown(test_neither_file, setup, teardown),
        cmocka_unit_test(test_real_mixtral_sharded),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
