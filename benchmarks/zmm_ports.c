/* Port throughput of the AVX-512 instructions the prefill kernels are made of, from
 * register-only loops (not a test): how many of each a core issues per cycle, and how a
 * mix of them schedules. Cycles come from the TSC scaled by a dependent `imul` chain
 * (3 cycles each), so turbo clocks count right; no perf counters needed (VMs often lack them).
 *
 *     gcc -O1 -mavx512f -mavx512vnni -o /tmp/zmm_ports benchmarks/zmm_ports.c && /tmp/zmm_ports
 *
 * On the 2-vCPU Sapphire Rapids class VM of docs/profiling.md ("Fourth pass"): vpdpbusd,
 * vcvtdq2ps and vfmadd231ps zmm 2 per cycle each, vpermps zmm 1 per cycle.
 */
#include <stdio.h>
#include <stdint.h>
#include <x86intrin.h>
#define IT 20000000ULL
static double ratio=1;
static void run(const char*name, int per, void(*f)(uint64_t)){ uint64_t t0=__rdtsc(); f(IT); uint64_t t1=__rdtsc(); double c=(double)(t1-t0)/IT*ratio; printf("%-44s %.2f core cycles per iteration (%d instrs)\n",name,c,per);}
#define CL "xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9","xmm10","xmm11","xmm12","xmm13","xmm14","xmm15","xmm16","xmm17","xmm18","xmm19","xmm20","xmm21","xmm22","xmm23","cc"
#define LOOP(body) asm volatile("1:\n" body "dec %0\njnz 1b\n" : "+r"(n) :: CL)
#define DP(r) "vpdpbusd %%zmm30,%%zmm31,%%zmm" #r "\n"
#define CV(r) "vcvtdq2ps %%zmm30,%%zmm" #r "\n"
#define PM(r) "vpermps %%zmm30,%%zmm31,%%zmm" #r "\n"
#define FM(r) "vfmadd231ps %%zmm30,%%zmm31,%%zmm" #r "\n"
static void dp16(uint64_t n){ LOOP(DP(0)DP(1)DP(2)DP(3)DP(4)DP(5)DP(6)DP(7)DP(8)DP(9)DP(10)DP(11)DP(12)DP(13)DP(14)DP(15)); }
static void fm16(uint64_t n){ LOOP(FM(0)FM(1)FM(2)FM(3)FM(4)FM(5)FM(6)FM(7)FM(8)FM(9)FM(10)FM(11)FM(12)FM(13)FM(14)FM(15)); }
/* one "block" of the pair kernel: 8 dp (8 chains), 8 cvt, 8 perm, 8 fma (8 chains) */
static void blk(uint64_t n){ LOOP(DP(0)DP(1)DP(2)DP(3)DP(4)DP(5)DP(6)DP(7) CV(16)CV(17)CV(18)CV(19)CV(20)CV(21)CV(22)CV(23) PM(16)PM(17)PM(18)PM(19)PM(20)PM(21)PM(22)PM(23) FM(8)FM(9)FM(10)FM(11)FM(12)FM(13)FM(14)FM(15)); }
static void blk_noperm(uint64_t n){ LOOP(DP(0)DP(1)DP(2)DP(3)DP(4)DP(5)DP(6)DP(7) CV(16)CV(17)CV(18)CV(19)CV(20)CV(21)CV(22)CV(23) FM(8)FM(9)FM(10)FM(11)FM(12)FM(13)FM(14)FM(15)); }
static void dp_cv(uint64_t n){ LOOP(DP(0)DP(1)DP(2)DP(3)DP(4)DP(5)DP(6)DP(7) CV(16)CV(17)CV(18)CV(19)CV(20)CV(21)CV(22)CV(23)); }
static void dp_pm(uint64_t n){ LOOP(DP(0)DP(1)DP(2)DP(3)DP(4)DP(5)DP(6)DP(7) PM(16)PM(17)PM(18)PM(19)PM(20)PM(21)PM(22)PM(23)); }
static void dp_fm(uint64_t n){ LOOP(DP(0)DP(1)DP(2)DP(3)DP(4)DP(5)DP(6)DP(7) FM(8)FM(9)FM(10)FM(11)FM(12)FM(13)FM(14)FM(15)); }
static void imulchain(uint64_t n){ uint64_t a=3; asm volatile("1:\n imul %1,%1\n imul %1,%1\n imul %1,%1\n imul %1,%1\n imul %1,%1\n imul %1,%1\n imul %1,%1\n imul %1,%1\n dec %0\n jnz 1b\n" : "+r"(n), "+r"(a) :: "cc"); }
static void zaddchain(uint64_t n){ LOOP("vaddps %%zmm30,%%zmm0,%%zmm0\n vaddps %%zmm30,%%zmm0,%%zmm0\n vaddps %%zmm30,%%zmm0,%%zmm0\n vaddps %%zmm30,%%zmm0,%%zmm0\n"); }
int main(){ { uint64_t t0=__rdtsc(); imulchain(IT); uint64_t t1=__rdtsc(); ratio = 24.0*IT/(double)(t1-t0); printf("scalar: %.3f core cycles per TSC tick\n", ratio);}
 { uint64_t t0=__rdtsc(); zaddchain(IT); uint64_t t1=__rdtsc(); printf("zmm vaddps chain: %.2f cycles per dependent zmm add (its latency, in core cycles)\n", (double)(t1-t0)*ratio/IT/4);}
 run("16 dpbusd",16,dp16); run("16 fma",16,fm16); run("block: 8 dp 8 cvt 8 perm 8 fma",32,blk); run("block without perm",24,blk_noperm);
 run("8 dp + 8 cvt",16,dp_cv); run("8 dp + 8 perm",16,dp_pm); run("8 dp + 8 fma",16,dp_fm); return 0;}
