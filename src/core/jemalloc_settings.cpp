// jemalloc's settings for loom's executables (cmake/LoomJemalloc.cmake compiles this file into
// each of them). jemalloc reads this string first, then MALLOC_CONF from the environment, so a
// user's own setting wins.
//
// dirty_decay_ms -1: freed pages stay with the allocator for the next step instead of going back
// to the kernel after 10 s, so a step's activations never fault in again (the same trade as the
// glibc policy before: memory is not returned between steps; the footprint is bounded by what a
// step needs, because jemalloc reuses freed extents of any size class).
// oversize_threshold 0: no dedicated arena for blocks over 8 MiB. That arena returns freed pages
// at once, so a step's big blocks faulted in again, and after the first validation pass the
// debug model's peak RSS rose 36-45 MiB and stayed there (one rank; +2 MiB without it).
// narenas 1: every thread allocates from one arena, so freed pages are reused by whichever
// thread allocates next. With jemalloc's arena per thread group, Gloo's worker threads (two per
// process group) each kept their own freed pages: FSDP x2 and HSDP 2x2 held 16-24 MiB more at
// the same step (docs/performance.md). Large blocks are few per step and small ones go through
// each thread's cache, so the shared arena's lock costs nothing measurable. The training thread
// of `loom train` and its intra-op threads then move to an arena of their own
// (use_own_heap_arena, cli/train_command.cpp): a step's blocks repeat exactly when no other
// thread's blocks land between them.
extern "C" {
extern const char* malloc_conf;
const char* malloc_conf = "dirty_decay_ms:-1,oversize_threshold:0,narenas:1";
}
