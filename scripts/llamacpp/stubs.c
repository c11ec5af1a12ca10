/*
 * The few symbols ggml.c refers to from files make_goldens.sh does not compile (the C++ backend and
 * threading sources). Quantizing never reaches the backend ones, so they abort if ever called; the
 * critical section only guards one-time table set-up, and the golden driver is single-threaded.
 */
#include <stdio.h>
#include <stdlib.h>

#include "ggml-backend.h"
#include "ggml-threading.h"

static void unreachable_stub(const char *name) {
    fprintf(stderr, "%s is not available in the golden driver\n", name);
    abort();
}

enum ggml_backend_buffer_usage ggml_backend_buffer_get_usage(ggml_backend_buffer_t buffer) {
    (void)buffer;
    unreachable_stub("ggml_backend_buffer_get_usage");
    return GGML_BACKEND_BUFFER_USAGE_ANY;
}

void ggml_backend_tensor_set(struct ggml_tensor *tensor, const void *data, size_t offset, size_t size) {
    (void)tensor; (void)data; (void)offset; (void)size;
    unreachable_stub("ggml_backend_tensor_set");
}

void ggml_backend_tensor_memset(struct ggml_tensor *tensor, uint8_t value, size_t offset, size_t size) {
    (void)tensor; (void)value; (void)offset; (void)size;
    unreachable_stub("ggml_backend_tensor_memset");
}

void ggml_critical_section_start(void) {}

void ggml_critical_section_end(void) {}
