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

/* Classes: the rows of bench/arm64/cost.py's tables (a class is a set of instructions the Neoverse
 * N1 and V1 optimization guides give one issue pipe group and throughput). Keep CLASS_NAMES and
 * cost.CLASSES in this order. */
enum {
    INT_DOT,      /* ASIMD SDOT/UDOT/USDOT/SUDOT, SMMLA/UMMLA/USMMLA */
    FP_FMA,       /* ASIMD FMLA/FMLS (vector, by element), scalar FMADD/FMSUB/FNMADD/FNMSUB */
    SVE_INT_DOT,  /* SVE SDOT/UDOT/USDOT/SUDOT, SMMLA/UMMLA/USMMLA */
    SVE_FP_FMA,   /* SVE FMLA/FMLS/FNMLA/FNMLS/FMAD/FMSB/FNMAD/FNMSB */
    SIMD_MUL_Q,   /* ASIMD integer MUL/MLA/MLS, Q-form (vector, by element) */
    SIMD_MUL,     /* ASIMD integer MUL/MLA/MLS D-form; long and saturating-doubling multiplies */
    SIMD_CVT_Q,   /* ASIMD int<->float and float<->float converts, Q-form */
    SIMD_CVT,     /* the same, D-form */
    SIMD_SHIFT,   /* ASIMD shifts by immediate (incl. SSHLL/USHLL = SXTL/UXTL, SHRN) and by register */
    SIMD,         /* every other ASIMD and scalar floating-point instruction */
    SVE,          /* every other SVE data-processing instruction */
    LOAD,         /* loads of any register file, prefetches */
    STORE,        /* stores, atomics (read-modify-write) */
    SCALAR,       /* integer data processing, immediate and register */
    BRANCH,       /* B, BL, B.cond, CBZ/CBNZ, TBZ/TBNZ, BR/BLR/RET */
    OTHER,        /* system (hints, barriers, MRS/MSR), exception generation (SVC), unallocated */
    N_CLASSES
};
static const char *const class_names[N_CLASSES] = {
    "int_dot", "fp_fma", "sve_int_dot", "sve_fp_fma", "simd_mul_q", "simd_mul", "simd_cvt_q", "simd_cvt",
    "simd_shift", "simd", "sve", "load", "store", "scalar", "branch", "other"};

struct pattern { uint32_t mask, value; };

static const struct pattern asimd_int_dot[] = {
    {0x9fe0fc00, 0x0e809400}, /* SDOT/UDOT (vector): 0 Q U 01110 10 0 Rm 100101 Rn Rd */
    {0x9fc0f400, 0x0f80e000}, /* SDOT/UDOT (by element): 0 Q U 01111 10 L M Rm 1110 H 0 Rn Rd */
    {0xbfe0fc00, 0x0e809c00}, /* USDOT (vector): 0 Q 0 01110 10 0 Rm 100111 Rn Rd */
    {0xbf40f400, 0x0f00f000}, /* SUDOT/USDOT (by element): 0 Q 0 01111 x0 L M Rm 1111 H 0 Rn Rd */
    {0xffe0fc00, 0x4e80a400}, /* SMMLA: 0100 1110 100 Rm 101001 Rn Rd */
    {0xffe0fc00, 0x6e80a400}, /* UMMLA: 0110 1110 100 Rm 101001 Rn Rd */
    {0xffe0fc00, 0x4e80ac00}, /* USMMLA: 0100 1110 100 Rm 101011 Rn Rd */
};
static const struct pattern asimd_fp_fma[] = {
    {0xbf20fc00, 0x0e20cc00}, /* FMLA/FMLS (vector, single/double): 0 Q 0 01110 o1 sz 1 Rm 110011 Rn Rd */
    {0xbf60fc00, 0x0e400c00}, /* FMLA/FMLS (vector, half): 0 Q 0 01110 a 10 Rm 000011 Rn Rd */
    {0xbf80b400, 0x0f801000}, /* FMLA/FMLS (by element, single/double): 0 Q 0 01111 1 sz L M Rm 0x01 H 0 */
    {0xbfc0b400, 0x0f001000}, /* FMLA/FMLS (by element, half): 0 Q 0 01111 00 L M Rm 0x01 H 0 */
    {0xff000000, 0x1f000000}, /* FMADD/FMSUB/FNMADD/FNMSUB (scalar): 0 0 0 11111 type o1 Rm o0 Ra Rn Rd */
};
static const struct pattern sve_int_dot[] = {
    {0xff20f800, 0x44000000}, /* SDOT/UDOT (vectors): 01000100 size 0 Zm 00000 U Zn Zda */
    {0xff20f800, 0x44200000}, /* SDOT/UDOT (indexed): 01000100 1 size 1 ... 00000 U Zn Zda */
    {0xffe0fc00, 0x44807800}, /* USDOT (vectors): 01000100 100 Zm 011110 Zn Zda */
    {0xffe0f800, 0x44a01800}, /* USDOT/SUDOT (indexed): 01000100 101 i2 Zm 00011 U Zn Zda */
    {0xff20fc00, 0x45009800}, /* SMMLA/USMMLA/UMMLA: 01000101 uns 0 Zm 100110 Zn Zda */
};
static const struct pattern sve_fp_fma[] = {
    {0xff200000, 0x65200000}, /* FMLA..FNMSB (predicated): 01100101 size 1 Zm/Za x opc Pg Zn Zd */
    {0xff20f800, 0x64200000}, /* FMLA/FMLS (indexed): 01100100 x size? 1 ... 00000 op Zn Zda */
};

#define N_OF(a) (sizeof(a) / sizeof *(a))

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

/* Advanced SIMD data processing that is not a dot product or a float multiply-add. */
static int asimd_class(uint32_t w) {
    int q = (w >> 30) & 1;
    if ((w & 0x9f800400) == 0x0f000400 && ((w >> 19) & 0xf) != 0) {          /* shift by immediate (immh != 0) */
        unsigned op = (w >> 11) & 0x1f;
        if (op == 0x1c || op == 0x1f) return q ? SIMD_CVT_Q : SIMD_CVT;      /* [SU]CVTF / FCVTZ[SU], fixed-point */
        return SIMD_SHIFT;
    }
    if ((w & 0x9f200400) == 0x0e200400) {                                     /* three same: 0 Q U 01110 size 1 Rm op 1 */
        unsigned op = (w >> 11) & 0x1f;
        if (op >= 0x08 && op <= 0x0b) return SIMD_SHIFT;                      /* [SU]Q?R?SHL (by register) */
        if ((op == 0x12 || op == 0x13) && !((w >> 29) & 1 && op == 0x13))     /* MLA/MLS, MUL (not PMUL) */
            return q ? SIMD_MUL_Q : SIMD_MUL;
        if (op == 0x16) return SIMD_MUL;                                      /* SQDMULH/SQRDMULH */
        return SIMD;
    }
    if ((w & 0x9f200c00) == 0x0e200000 && ((w >> 12) & 0xf) >= 8 && ((w >> 12) & 0xf) != 0xf)
        return SIMD_MUL;                                                      /* three different: [SU]MLAL/MLSL/MULL, SQDM* */
    if ((w & 0x9f000400) == 0x0f000000) {                                     /* by element: 0 Q U 01111 size L M Rm op H 0 */
        unsigned op = (w >> 12) & 0xf, u = (w >> 29) & 1;
        if ((op == 0x8 && !u) || ((op == 0x0 || op == 0x4) && u)) return q ? SIMD_MUL_Q : SIMD_MUL; /* MUL, MLA, MLS */
        if (op == 0x2 || op == 0x3 || op == 0x6 || op == 0x7 || op == 0xa || op == 0xb || op == 0xc || op == 0xd)
            return SIMD_MUL;                                                  /* long / saturating multiplies */
        return SIMD;
    }
    if ((w & 0x9f3e0c00) == 0x0e200800) {                                     /* two-register misc: 0 Q U 01110 size 10000 op 10 */
        unsigned op = (w >> 12) & 0x1f;
        if (op == 0x16 || op == 0x17 || (op >= 0x1a && op <= 0x1d)) return q ? SIMD_CVT_Q : SIMD_CVT; /* FCVTN/L, FCVT*, [SU]CVTF */
        return SIMD;
    }
    return SIMD;
}

static int insn_class(uint32_t w) {
    uint32_t op0 = (w >> 25) & 0xf;
    if (op0 == 0x2) {                                                         /* SVE */
        uint32_t top = w >> 29;
        if (top == 4 || top == 5 || top == 6) return LOAD;                    /* gathers, contiguous loads, LDR */
        if (top == 7) return STORE;                                           /* contiguous / scatter stores, STR */
        if (matches(sve_int_dot, N_OF(sve_int_dot), w)) return SVE_INT_DOT;
        if (matches(sve_fp_fma, N_OF(sve_fp_fma), w)) return SVE_FP_FMA;
        return SVE;
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
        if (matches(asimd_int_dot, N_OF(asimd_int_dot), w)) return INT_DOT;
        if (matches(asimd_fp_fma, N_OF(asimd_fp_fma), w)) return FP_FMA;
        if (!(w & 0x80000000) && (w & 0x1e000000) == 0x0e000000) return asimd_class(w); /* 0 x x 0111x: vector */
        return SIMD;                                                          /* scalar FP and scalar SIMD */
    }
    return OTHER;
}

#endif
