/* SPDX-License-Identifier: GPL-2.0-or-later
 *
 * The A64 instruction classes of insn_classes.c (the qemu plugin), with no qemu dependency so
 * tests/bench/test_arm64_cost.py can compile it alone and check it on assembled instruction
 * words. Encodings: Arm Architecture Reference Manual for A-profile, "A64 Instruction Set
 * Encoding" (the top-level op0 groups and the SIMD / SVE encoding classes named per row).
 */
#ifndef WARMLLM_INSN_DECODE_H
#define WARMLLM_INSN_DECODE_H
#include <stddef.h>
#include <stdint.h>

enum { INT_DOT, FP_FMA, SIMD, LOAD, STORE, SCALAR, BRANCH, OTHER, N_CLASSES };
static const char *const class_names[N_CLASSES] = {"int_dot", "fp_fma", "simd", "load", "store", "scalar", "branch",
                                             "other"};

struct pattern { uint32_t mask, value; };

/* Integer dot product / matrix multiply (Arm ARM, A64 encoding index). */
static const struct pattern int_dot_patterns[] = {
    {0x9fe0fc00, 0x0e809400}, /* SDOT/UDOT (vector): 0 Q U 01110 10 0 Rm 100101 Rn Rd */
    {0x9fc0f400, 0x0f80e000}, /* SDOT/UDOT (by element): 0 Q U 01111 10 L M Rm 1110 H 0 Rn Rd */
    {0xbfe0fc00, 0x0e809c00}, /* USDOT (vector): 0 Q 0 01110 10 0 Rm 100111 Rn Rd */
    {0xbf40f400, 0x0f00f000}, /* SUDOT/USDOT (by element): 0 Q 0 01111 x0 L M Rm 1111 H 0 Rn Rd */
    {0xffe0fc00, 0x4e80a400}, /* SMMLA: 0100 1110 100 Rm 101001 Rn Rd */
    {0xffe0fc00, 0x6e80a400}, /* UMMLA: 0110 1110 100 Rm 101001 Rn Rd */
    {0xffe0fc00, 0x4e80ac00}, /* USMMLA: 0100 1110 100 Rm 101011 Rn Rd */
    {0xff20f800, 0x44000000}, /* SVE SDOT/UDOT (vectors): 01000100 size 0 Zm 00000 U Zn Zda */
    {0xff20f800, 0x44200000}, /* SVE SDOT/UDOT (indexed): 01000100 1 size 1 ... 00000 U Zn Zda */
    {0xffe0fc00, 0x44807800}, /* SVE USDOT (vectors): 01000100 100 Zm 011110 Zn Zda */
    {0xff20fc00, 0x45009800}, /* SVE SMMLA/USMMLA/UMMLA: 01000101 uns 0 Zm 100110 Zn Zda */
};

/* Float multiply-add. */
static const struct pattern fp_fma_patterns[] = {
    {0xbf20fc00, 0x0e20cc00}, /* FMLA/FMLS (vector, single/double): 0 Q 0 01110 o1 sz 1 Rm 110011 Rn Rd */
    {0xbf60fc00, 0x0e400c00}, /* FMLA/FMLS (vector, half): 0 Q 0 01110 a 10 Rm 000011 Rn Rd */
    {0xbf80b400, 0x0f801000}, /* FMLA/FMLS (by element, single/double): 0 Q 0 01111 1 sz L M Rm 0x01 H 0 */
    {0xbfc0b400, 0x0f001000}, /* FMLA/FMLS (by element, half): 0 Q 0 01111 00 L M Rm 0x01 H 0 */
    {0xff000000, 0x1f000000}, /* FMADD/FMSUB/FNMADD/FNMSUB (scalar): 0 0 0 11111 type o1 Rm o0 Ra Rn Rd */
    {0xff200000, 0x65200000}, /* SVE FMLA..FNMSB (predicated): 01100101 size 1 Zm/Za x opc Pg Zn Zd */
    {0xff20f800, 0x64200000}, /* SVE FMLA/FMLS (indexed): 01100100 x size? 1 ... 00000 op Zn Zda */
};

static int matches(const struct pattern *p, size_t n, uint32_t w) {
    for (size_t i = 0; i < n; i++)
        if ((w & p[i].mask) == p[i].value) return 1;
    return 0;
}

/* A load/store encoding (op0 = x1x0): store or load. */
static int is_store(uint32_t w) {
    if ((w & 0xbe000000) == 0x0c000000) return !(w & (1u << 22));            /* SIMD ld/st structures: L */
    if ((w & 0x38000000) == 0x28000000) return !(w & (1u << 22));            /* load/store pair: L */
    if ((w & 0x3b000000) == 0x18000000) return 0;                             /* load literal (and PRFM) */
    if ((w & 0x3f000000) == 0x08000000) return !(w & (1u << 22));            /* exclusive / ordered: L */
    if ((w & 0x38000000) == 0x38000000) {                                     /* register forms: size V opc */
        unsigned opc = (w >> 22) & 3, v = (w >> 26) & 1;
        if (!(w & (1u << 24)) && (w & (1u << 21)) && ((w >> 10) & 3) == 0 && !v) return 1; /* atomics: RMW */
        return v ? !(opc & 1) : opc == 0;                                     /* SIMD: opc<0>; GPR: opc 00 */
    }
    return !(w & (1u << 22));
}

static int insn_class(uint32_t w) {
    uint32_t op0 = (w >> 25) & 0xf;
    if (op0 == 0x2) {                                                         /* SVE */
        uint32_t top = w >> 29;
        if (top == 4 || top == 5 || top == 6) return LOAD;                    /* gathers, contiguous loads, LDR */
        if (top == 7) return STORE;                                           /* contiguous / scatter stores, STR */
        if (matches(int_dot_patterns, sizeof int_dot_patterns / sizeof *int_dot_patterns, w)) return INT_DOT;
        if (matches(fp_fma_patterns, sizeof fp_fma_patterns / sizeof *fp_fma_patterns, w)) return FP_FMA;
        return SIMD;
    }
    if ((op0 & 0xe) == 0x8) return SCALAR;                                    /* 100x: data processing, imm */
    if ((op0 & 0xe) == 0xa) {                                                 /* 101x: branch, exception, system */
        if ((w & 0x7c000000) == 0x14000000) return BRANCH;                    /* B, BL */
        if ((w & 0x7e000000) == 0x34000000) return BRANCH;                    /* CBZ, CBNZ */
        if ((w & 0x7e000000) == 0x36000000) return BRANCH;                    /* TBZ, TBNZ */
        if ((w & 0xff000000) == 0x54000000) return BRANCH;                    /* B.cond */
        if ((w & 0xfe000000) == 0xd6000000) return BRANCH;                    /* BR, BLR, RET */
        return OTHER;
    }
    if ((op0 & 0x5) == 0x4) return is_store(w) ? STORE : LOAD;                /* x1x0: loads and stores */
    if ((op0 & 0x7) == 0x5) return SCALAR;                                    /* x101: data processing, reg */
    if ((op0 & 0x7) == 0x7) {                                                 /* x111: SIMD and FP */
        if (matches(int_dot_patterns, sizeof int_dot_patterns / sizeof *int_dot_patterns, w)) return INT_DOT;
        if (matches(fp_fma_patterns, sizeof fp_fma_patterns / sizeof *fp_fma_patterns, w)) return FP_FMA;
        return SIMD;
    }
    return OTHER;
}

#endif
