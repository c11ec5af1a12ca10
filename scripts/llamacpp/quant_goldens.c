/*
 * Writes quantization goldens from ggml's own quantizers: for each type, deterministic input rows
 * (`<TYPE>.input.f32`, little-endian f32) and what `ggml_quantize_chunk` makes of them without an
 * importance matrix (`<TYPE>.llamacpp`), which is what llama-quantize writes for a tensor when no
 * imatrix is given. Built and run by make_goldens.sh.
 *
 *     quant_goldens OUT_DIR
 *
 * The inputs come from integer arithmetic only (splitmix64, exact int-to-float conversions and
 * float adds and multiplies), so they do not depend on the C library's maths functions.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml.h"

#define ROWS 8
#define COLS 256

static uint64_t rng_state;

static uint64_t next_u64(void) {
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [0, 1) with 24 random bits: exact in f32. */
static float uniform(void) {
    return (float)(next_u64() >> 40) * (1.0f / 16777216.0f);
}

/* Roughly normal (Irwin-Hall of four uniforms, unit variance). */
static float normal(void) {
    float s = uniform() + uniform() + uniform() + uniform();
    return (s - 2.0f) * 1.7320508f;
}

static void make_rows(float *x, uint64_t seed) {
    rng_state = seed;
    for (int r = 0; r < ROWS; ++r) {
        float *row = x + r * COLS;
        for (int i = 0; i < COLS; ++i) {
            float v = 0.0f;
            switch (r) {
            case 0: /* plain normal */
                v = normal();
                break;
            case 1: /* small values with outliers, one of them a lone spike */
                v = 0.02f * normal();
                if (next_u64() % 29 == 0) v *= 60.0f;
                if (i == 77) v = -9.5f;
                break;
            case 2: /* all zero */
                v = 0.0f;
                break;
            case 3: /* tiny groups: some above, some below the all-zero threshold, some exact zeros */
                if (i < 64) v = 1e-7f * normal();
                else if (i < 128) v = 1e-18f * normal();
                else if (i < 192) v = 0.0f;
                else v = 3e-5f * normal();
                break;
            case 4: /* all positive */
                v = 0.5f + 1.5f * uniform();
                break;
            case 5: /* a coarse grid (ties in rounding), then a constant stretch */
                if (i < 192) v = 0.25f * (float)((int)(next_u64() % 9) - 4);
                else v = 0.7f;
                break;
            case 6: { /* each group of 16 at its own magnitude, 2^-12 .. 2^12 */
                int e = (int)((i / 16) * 3 % 25) - 12;
                float m = 1.0f;
                for (int k = 0; k < (e < 0 ? -e : e); ++k) m *= 2.0f;
                v = normal() * (e < 0 ? 1.0f / m : m);
                break;
            }
            default: /* mostly negative */
                v = -3.0f * uniform();
                if (next_u64() % 11 == 0) v = 0.1f * uniform();
                break;
            }
            row[i] = v;
        }
    }
}

static void write_file(const char *dir, const char *name, const char *ext, const void *data, size_t n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.%s", dir, name, ext);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n || fclose(f) != 0) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(1);
    }
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
        return 2;
    }
    static const enum ggml_type types[] = {
        GGML_TYPE_Q2_K, GGML_TYPE_Q3_K, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K,
        GGML_TYPE_Q6_K, GGML_TYPE_IQ4_NL, GGML_TYPE_IQ4_XS,
    };
    static float x[ROWS * COLS];
    for (size_t t = 0; t < sizeof types / sizeof types[0]; ++t) {
        enum ggml_type ty = types[t];
        make_rows(x, 0x6767ull * 1000003ull + (uint64_t)ty);
        size_t row_size = ggml_row_size(ty, COLS);
        unsigned char *q = calloc(ROWS, row_size);
        size_t n = ggml_quantize_chunk(ty, x, q, 0, ROWS, COLS, NULL);
        if (n != ROWS * row_size) {
            fprintf(stderr, "%s: %zu bytes, expected %zu\n", ggml_type_name(ty), n, ROWS * row_size);
            return 1;
        }
        char name[64];
        snprintf(name, sizeof name, "%s", ggml_type_name(ty));
        for (char *c = name; *c; ++c) if (*c >= 'a' && *c <= 'z') *c -= 32;
        write_file(argv[1], name, "input.f32", x, sizeof x);
        write_file(argv[1], name, "llamacpp", q, n);
        printf("%s: %d rows x %d values -> %zu bytes\n", name, ROWS, COLS, n);
        free(q);
    }
    return 0;
}
