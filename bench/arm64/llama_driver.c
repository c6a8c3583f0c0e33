/* The llama.cpp side of `make bench-arm64`: the phases bench/arm64/ours.py runs on our engine,
 * on llama.cpp's C API, one thread, bracketed by the phase markers the counting plugin
 * (insn_classes.c) snapshots its counters at.
 *
 *   llama_driver MODEL [P1 P2 N]   (default 128 512 16)
 *
 * Phases: 0 start of measurement (after load and a warm-up prefill of 70 tokens + 2 decode
 * steps, as llama-bench warms up), 1 after a P1-token prefill, 2 after a fresh P2-token
 * prefill, 3 after N decode steps that continue the P2 prompt. A marker is
 * lseek(-1, MARK_MAGIC, phase): EBADF on any kernel, so the program behaves the same without
 * the plugin. Token ids: a fixed LCG in [0, 4000), as engine/bench.py draws below 4000.
 * Built by bench/arm64/build.py against the llama-cpp-python source, and with -DWARMLLM_IK_LLAMA
 * against ik_llama.cpp's (ik-llama-cpp-python's sdist: its older API clears the KV cache and
 * frees the model by other names; its weights repacked at load and flash attention on, as
 * bench/peers.py runs its llama-bench: -rtr 1 -fa 1); no llama.cpp code here. */
#include <errno.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "llama.h"

#define MARK_MAGIC 0x5741524dL /* "WARM", also in insn_classes.c and bench/arm64/ours.py */

/* each mark's monotonic time: natively, the phases' wall times (the x86 calibration measures
 * them, bench/arm64/calibrate.py); under qemu they mean nothing */
static double mark_s[4];
static void mark(int phase) {
    (void)lseek(-1, MARK_MAGIC, phase);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    mark_s[phase] = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int verbose; /* LLAMA_DRIVER_VERBOSE=1: llama.cpp's whole load log (buffer types, repacks) */
static void quiet(enum ggml_log_level level, const char *text, void *user) {
    (void)user;
    if (verbose || level >= GGML_LOG_LEVEL_WARN) fputs(text, stderr);
}

static unsigned lcg = 12345u;
static llama_token next_id(void) { lcg = lcg * 1103515245u + 12345u; return (llama_token)((lcg >> 8) % 4000u); }

/* one llama_decode of n tokens at positions pos..pos+n-1; logits for the last only, as a prefill wants */
static void run(struct llama_context *ctx, struct llama_batch *b, int n, int pos) {
    b->n_tokens = n;
    for (int i = 0; i < n; i++) {
        b->token[i] = next_id();
        b->pos[i] = pos + i;
        b->n_seq_id[i] = 1;
        b->seq_id[i][0] = 0;
        b->logits[i] = i == n - 1;
    }
    if (llama_decode(ctx, *b) != 0) { fprintf(stderr, "llama_decode failed at n=%d pos=%d\n", n, pos); exit(1); }
    (void)llama_get_logits_ith(ctx, -1);
}

int main(int argc, char **argv) {
    if (argc != 2 && argc != 5) { fprintf(stderr, "usage: %s MODEL [P1 P2 N]\n", argv[0]); return 2; }
    int p1 = argc == 5 ? atoi(argv[2]) : 128, p2 = argc == 5 ? atoi(argv[3]) : 512, n = argc == 5 ? atoi(argv[4]) : 16;
    verbose = getenv("LLAMA_DRIVER_VERBOSE") != NULL;
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
#ifdef WARMLLM_IK_LLAMA
    mp.repack_tensors = true;
#endif
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) { fprintf(stderr, "cannot load %s\n", argv[1]); return 1; }
    struct llama_context_params cp = llama_context_default_params();
    int big = p1 > p2 ? p1 : p2;
    if (big < 72) big = 72;                                      /* the warm-up's 70 + 2 positions */
    cp.n_ctx = (uint32_t)(big + n + 16);
    cp.n_batch = cp.n_ubatch = (uint32_t)big;                    /* one ubatch per prefill, as llama-bench -p 512 */
    cp.n_threads = cp.n_threads_batch = 1;
#ifdef WARMLLM_IK_LLAMA
    cp.flash_attn = true;
#endif
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) { fprintf(stderr, "cannot create a context\n"); return 1; }
    struct llama_batch b = llama_batch_init((int32_t)cp.n_batch, 0, 1);
#ifndef WARMLLM_IK_LLAMA
    llama_memory_t mem = llama_get_memory(ctx);
#define CLEAR_CACHE() llama_memory_clear(mem, true)
#else
#define CLEAR_CACHE() llama_kv_cache_clear(ctx)
#define llama_model_free llama_free_model
#endif

    run(ctx, &b, 70, 0); run(ctx, &b, 1, 70); run(ctx, &b, 1, 71);   /* warm-up */
    CLEAR_CACHE();
    mark(0);
    run(ctx, &b, p1, 0);
    mark(1);
    CLEAR_CACHE();
    run(ctx, &b, p2, 0);
    mark(2);
    for (int i = 0; i < n; i++) run(ctx, &b, 1, p2 + i);
    mark(3);
    printf("{\"p1\": %d, \"p2\": %d, \"n\": %d, \"n_vocab\": %d, \"phase_ms\": [%.3f, %.3f, %.3f]}\n", p1, p2, n,
           llama_vocab_n_tokens(llama_model_get_vocab(model)), 1e3 * (mark_s[1] - mark_s[0]),
           1e3 * (mark_s[2] - mark_s[1]), 1e3 * (mark_s[3] - mark_s[2]));
    llama_batch_free(b);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
