/* SPDX-License-Identifier: GPL-2.0-or-later (a plugin loaded into qemu, built against its API header)
 *
 * insn_classes: a qemu TCG plugin that counts the aarch64 instructions a program executes, by
 * class, for `make bench-arm64`'s cost model (bench/arm64/cost.py).
 *
 *   qemu-aarch64 -plugin .bench/arm64/insn_classes.so,out=FILE[,mode=tb|insn][,blocks=FILE] PROGRAM...
 *
 * Classes (decoded from the A64 encoding at translation time; the table is insn_class() and
 * tests/bench/test_arm64_cost.py checks it on assembled instruction words):
 *   int_dot   integer dot product / matrix multiply: SDOT, UDOT, USDOT, SUDOT (vector and by
 *             element), SMMLA, UMMLA, USMMLA, and their SVE forms
 *   fp_fma    float multiply-add: FMLA/FMLS (vector, by element, half/single/double), scalar
 *             FMADD/FMSUB/FNMADD/FNMSUB, SVE FMLA/FMLS/FNMLA/FNMLS/FMAD/FMSB/FNMAD/FNMSB
 *   simd      every other Advanced SIMD, scalar floating-point and SVE data-processing instruction
 *   load      loads of any register file (scalar, SIMD, SVE), and prefetches (they use a load pipe)
 *   store     stores, including atomics (read-modify-write)
 *   scalar    integer data processing (immediate and register)
 *   branch    B, BL, B.cond, CBZ/CBNZ, TBZ/TBNZ, BR/BLR/RET
 *   other     system instructions (hints, barriers, MRS/MSR), exception generation (SVC), and
 *             encodings outside these groups
 *
 * Counting: mode=tb (default) adds each class's count in a translation block once per block
 * execution (one inline add per class present); mode=insn adds 1 per executed instruction
 * (qemu_plugin_register_vcpu_insn_exec_inline), several times slower. They differ only when a
 * block is left in the middle (a fault), which the benchmarked programs do not do.
 *
 * Blocks (blocks=FILE, for the per-block pricing of bench/arm64/mca.py): every translation block
 * also gets a counter of its own, and the plugin writes, per block, its address, its instruction
 * words and its execution count at each mark and at exit (text, one block a line):
 *   warmllm-blocks 1 <target>
 *   marks <n> <phase>...
 *   <vaddr hex> <n insns> <code> <count at mark 0> ... <total>
 * <code>: on aarch64 the instruction words, 8 hex digits each, concatenated; on other targets
 * (x86_64, for the method's calibration on a host whose speed can be measured) each
 * instruction's bytes in hex, instructions separated by '.'. There the plugin only records
 * blocks: the classes are A64's (blocks= is required).
 * A block translated again (a flush, another entry point) is another line: the reader merges.
 *
 * Phases: the program calls lseek(-1, MARK_MAGIC, phase) (EBADF on any kernel); the plugin's
 * syscall callback snapshots the counters with the phase id. At exit it writes JSON:
 *   {"classes": [...], "mode": "tb", "marks": [{"phase": p, "counts": [...]}, ...], "total": [...]}
 * The counters are shared by all vCPUs (threads) and updated without atomics: run one thread.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <qemu-plugin.h>

#include "insn_decode.h"

QEMU_PLUGIN_EXPORT int qemu_plugin_version = QEMU_PLUGIN_VERSION;

#define MARK_MAGIC 0x5741524dULL  /* "WARM": bench/arm64/llama_driver.c and bench/arm64/ours.py */
#define NR_LSEEK_AARCH64 62       /* asm-generic/unistd.h __NR3264_lseek */
#define NR_LSEEK_X86_64 8         /* arch/x86/entry/syscalls/syscall_64.tbl */
#define MAX_MARKS 64

static uint64_t counts[N_CLASSES];
static struct { int64_t phase; uint64_t counts[N_CLASSES]; } marks[MAX_MARKS];
static int n_marks;
static int per_insn;
static int a64;  /* the target is aarch64: classify; otherwise only blocks= */
static int64_t nr_lseek;
static char *out_path;

/* blocks=FILE: one record per translated block, its counter updated inline on each execution */
struct block { uint64_t vaddr; size_t n; char *code; uint64_t count; };
static char *blocks_path;
static struct block **blocks;
static size_t n_blocks, cap_blocks;
static uint64_t *block_marks[MAX_MARKS];  /* each block's count at mark m (blocks[0..n_at_mark)) */
static size_t block_marks_n[MAX_MARKS];
static pthread_mutex_t blocks_lock = PTHREAD_MUTEX_INITIALIZER;

static void record_block(struct qemu_plugin_tb *tb, size_t n) {
    struct block *b = calloc(1, sizeof *b);
    size_t len = 1;
    for (size_t i = 0; i < n; i++) len += 2 * qemu_plugin_insn_size(qemu_plugin_tb_get_insn(tb, i)) + 1;
    char *code = malloc(len), *p = code;
    if (!b || !code) { fprintf(stderr, "insn_classes: out of memory\n"); exit(1); }
    for (size_t i = 0; i < n; i++) {
        struct qemu_plugin_insn *insn = qemu_plugin_tb_get_insn(tb, i);
        const uint8_t *bytes = qemu_plugin_insn_data(insn);
        size_t size = qemu_plugin_insn_size(insn);
        if (a64) {  /* the little-endian word as a number, as the classifier reads it */
            uint32_t w;
            memcpy(&w, bytes, sizeof w);
            p += sprintf(p, "%08" PRIx32, w);
        } else {
            if (i) *p++ = '.';
            for (size_t k = 0; k < size; k++) p += sprintf(p, "%02x", bytes[k]);
        }
    }
    *p = '\0';
    b->vaddr = qemu_plugin_tb_vaddr(tb);
    b->n = n;
    b->code = code;
    pthread_mutex_lock(&blocks_lock);
    if (n_blocks == cap_blocks) {
        cap_blocks = cap_blocks ? 2 * cap_blocks : 4096;
        blocks = realloc(blocks, cap_blocks * sizeof *blocks);
        if (!blocks) { fprintf(stderr, "insn_classes: out of memory\n"); exit(1); }
    }
    blocks[n_blocks++] = b;
    pthread_mutex_unlock(&blocks_lock);
    qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &b->count, 1);
}

static void vcpu_tb_trans(qemu_plugin_id_t id, struct qemu_plugin_tb *tb) {
    size_t n = qemu_plugin_tb_n_insns(tb);
    uint64_t in_tb[N_CLASSES] = {0};
    if (blocks_path) record_block(tb, n);
    if (!a64) return;
    for (size_t i = 0; i < n; i++) {
        struct qemu_plugin_insn *insn = qemu_plugin_tb_get_insn(tb, i);
        uint32_t w;
        memcpy(&w, qemu_plugin_insn_data(insn), sizeof w);                    /* A64: 4 bytes, little-endian */
        int c = insn_class(w);
        if (per_insn)
            qemu_plugin_register_vcpu_insn_exec_inline(insn, QEMU_PLUGIN_INLINE_ADD_U64, &counts[c], 1);
        else
            in_tb[c]++;
    }
    if (!per_insn)
        for (int c = 0; c < N_CLASSES; c++)
            if (in_tb[c]) qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &counts[c], in_tb[c]);
}

static void vcpu_syscall(qemu_plugin_id_t id, unsigned int vcpu, int64_t num, uint64_t a1, uint64_t a2, uint64_t a3,
                         uint64_t a4, uint64_t a5, uint64_t a6, uint64_t a7, uint64_t a8) {
    /* fd -1: an int, so only its low 32 bits are sure (x86_64's glibc leaves the high ones zero) */
    if (num != nr_lseek || (uint32_t)a1 != UINT32_MAX || a2 != MARK_MAGIC || n_marks == MAX_MARKS) return;
    marks[n_marks].phase = (int64_t)a3;
    memcpy(marks[n_marks].counts, counts, sizeof counts);
    if (blocks_path) {
        pthread_mutex_lock(&blocks_lock);
        block_marks[n_marks] = malloc((n_blocks ? n_blocks : 1) * sizeof(uint64_t));
        if (!block_marks[n_marks]) { fprintf(stderr, "insn_classes: out of memory\n"); exit(1); }
        for (size_t i = 0; i < n_blocks; i++) block_marks[n_marks][i] = blocks[i]->count;
        block_marks_n[n_marks] = n_blocks;
        pthread_mutex_unlock(&blocks_lock);
    }
    n_marks++;
}

static void write_counts(FILE *f, const uint64_t *c) {
    fputc('[', f);
    for (int i = 0; i < N_CLASSES; i++) fprintf(f, "%s%" PRIu64, i ? ", " : "", c[i]);
    fputc(']', f);
}

static void write_blocks(void) {
    FILE *f = fopen(blocks_path, "w");
    if (!f) { fprintf(stderr, "insn_classes: cannot write blocks=%s\n", blocks_path); return; }
    fprintf(f, "warmllm-blocks 1 %s\nmarks %d", a64 ? "aarch64" : "x86_64", n_marks);
    for (int m = 0; m < n_marks; m++) fprintf(f, " %" PRId64, marks[m].phase);
    fputc('\n', f);
    for (size_t i = 0; i < n_blocks; i++) {
        const struct block *b = blocks[i];
        if (!b->count) continue;  /* translated, never run */
        fprintf(f, "%" PRIx64 " %zu %s", b->vaddr, b->n, b->code);
        for (int m = 0; m < n_marks; m++) fprintf(f, " %" PRIu64, i < block_marks_n[m] ? block_marks[m][i] : 0);
        fprintf(f, " %" PRIu64 "\n", b->count);
    }
    fclose(f);
}

static void plugin_exit(qemu_plugin_id_t id, void *p) {
    if (blocks_path) write_blocks();
    if (!a64) return;
    FILE *f = out_path ? fopen(out_path, "w") : stderr;
    if (!f) { fprintf(stderr, "insn_classes: cannot write out=%s\n", out_path); return; }
    fputs("{\"classes\": [", f);
    for (int i = 0; i < N_CLASSES; i++) fprintf(f, "%s\"%s\"", i ? ", " : "", class_names[i]);
    fprintf(f, "], \"mode\": \"%s\", \"marks\": [", per_insn ? "insn" : "tb");
    for (int m = 0; m < n_marks; m++) {
        fprintf(f, "%s{\"phase\": %" PRId64 ", \"counts\": ", m ? ", " : "", marks[m].phase);
        write_counts(f, marks[m].counts);
        fputc('}', f);
    }
    fputs("], \"total\": ", f);
    write_counts(f, counts);
    fputs("}\n", f);
    if (f != stderr) fclose(f);
}

QEMU_PLUGIN_EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info, int argc, char **argv) {
    a64 = strcmp(info->target_name, "aarch64") == 0;
    if (!a64 && strcmp(info->target_name, "x86_64") != 0) {
        fprintf(stderr, "insn_classes: aarch64 or x86_64, not %s\n", info->target_name);
        return -1;
    }
    nr_lseek = a64 ? NR_LSEEK_AARCH64 : NR_LSEEK_X86_64;
    for (int i = 0; i < argc; i++) {
        if (strncmp(argv[i], "out=", 4) == 0) out_path = strdup(argv[i] + 4);
        else if (strcmp(argv[i], "mode=insn") == 0) per_insn = 1;
        else if (strcmp(argv[i], "mode=tb") == 0) per_insn = 0;
        else if (strncmp(argv[i], "blocks=", 7) == 0) blocks_path = strdup(argv[i] + 7);
        else { fprintf(stderr, "insn_classes: unknown argument %s (out=FILE, mode=tb|insn, blocks=FILE)\n", argv[i]); return -1; }
    }
    if (!a64 && !blocks_path) {
        fprintf(stderr, "insn_classes: on %s only blocks=FILE (the classes decode A64)\n", info->target_name);
        return -1;
    }
    qemu_plugin_register_vcpu_tb_trans_cb(id, vcpu_tb_trans);
    qemu_plugin_register_vcpu_syscall_cb(id, vcpu_syscall);
    qemu_plugin_register_atexit_cb(id, plugin_exit, NULL);
    return 0;
}
