// specula_probes_pre.cuh: put before the kernel text by scripts/kernel-report.py only. Makes the
// cold-region marks of specula_verify.cu visible in the SASS (a PMTRIG instruction), so that the
// report can leave the rarely taken path out of a hot loop's instruction count.
#define SP_COLD_MARK() asm volatile("pmevent 0;")
