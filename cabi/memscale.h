/*
 * memscale.h - C ABI of libmemscale.so, a CUDA caching allocator with Dynamic
 * Tensor Rematerialization, written in Go.
 *
 * PyTorch loads it with
 *   torch.cuda.memory.CUDAPluggableAllocator(path, "memscale_malloc_or_throw",
 *                                            "memscale_free")
 * (memscale_malloc_or_throw turns an allocation failure into a C++ exception,
 * which PyTorch reports as a Python RuntimeError; memscale_malloc returns NULL,
 * which PyTorch does not check) and the optional hooks (memscale_init,
 * memscale_empty_cache, memscale_set_memory_fraction, memscale_record_stream)
 * through alloc._allocator.set_xxx_fn(address).
 *
 * Conventions
 *  - No call ever lets a Go panic reach the caller, and none but
 *    memscale_malloc_or_throw and memscale_begin_allocate_to_pool throws a
 *    C++ exception: failures are recorded
 *    and read with memscale_last_error().
 *  - int-returning calls return 0 (or a count/id >= 0) on success, -1 on error.
 *  - char* results are malloc'd; free them with memscale_string_free. NULL means
 *    an error (see memscale_last_error).
 *  - Configuration is read from the MEMSCALE_* environment variables at the
 *    first call that needs it. A malformed value makes every allocation fail
 *    (NULL) with an error naming the variable, the value and what is accepted.
 *    The DTR engine's defaults (MEMSCALE_HEURISTIC, MEMSCALE_RECOMP_*_FACTOR,
 *    MEMSCALE_EVICTEE_MIN_SIZE) are read again at every memscale_dtr_create,
 *    from the process's current environment (setenv is seen).
 *  - Fork: in a child created by fork() (e.g. a DataLoader worker) the library
 *    does not enter the Go runtime: memscale_malloc returns NULL, memscale_free
 *    and the other void hooks do nothing, calls returning int/int32/int64 (the
 *    DTR engine's memscale_dtr_* included) return -1, calls returning a
 *    pointer (char*, memscale_dtr_status_of) return NULL, and
 *    memscale_last_error() returns a fixed message saying so.
 *  - Thread-safe. The symbols memscale_go_* are internal; do not call them.
 */
#ifndef MEMSCALE_H
#define MEMSCALE_H

#include <stdint.h>
#include <sys/types.h> /* ssize_t */

#ifdef __cplusplus
extern "C" {
#endif

/* Version of this header and of the library it describes. */
#define MEMSCALE_VERSION "0.2.0"

#ifndef MEMSCALE_CUDA_STREAM_T_DEFINED
#define MEMSCALE_CUDA_STREAM_T_DEFINED
#if !defined(__CUDA_RUNTIME_H__) && !defined(__DRIVER_TYPES_H__)
/* The same handle as CUstream / cudaStream_t; 0 is the legacy default stream. */
typedef void* cudaStream_t;
#endif
#endif

/* ---- PyTorch pluggable allocator ---------------------------------------- */

/* Allocates size bytes on device for use on stream. NULL on error (bad size,
 * bad device, out of memory, bad configuration). size 0 returns a valid,
 * unique, freeable pointer (a minimum-size block).
 * When memory is short it waits for the device's streams and releases cached
 * memory; if that is not enough and a reclaimer is installed
 * (memscale_set_reclaimer), it asks the reclaimer for the missing bytes and
 * retries, up to 8 rounds while the reclaimer frees something. When it then
 * fails, memscale_last_error() says so, e.g. (one line; a 64 MiB limit, 48 MiB
 * allocated, and an engine whose resident storages are all locked or pinned)
 *   memscale_malloc: 33554432 bytes on device 0: allocator: out of memory:
 *   tried to allocate 32.00 MiB (33554432 bytes, block 33554432 bytes) on
 *   stream 0x0; allocated 48.00 MiB (50331648 bytes), reserved 48.00 MiB
 *   (50331648 bytes), limit 64.00 MiB (67108864 bytes), device free
 *   976.00 MiB; the reclaimer was asked 1 time and freed 0 B (0 bytes);
 *   num_alloc_retries=1 num_ooms=1: device out of memory; the DTR engine
 *   could not free enough: engine 1: reclaim of 16777216 bytes found 0:
 *   nothing more is evictable (4 resident storages, 50331748 bytes: 1 pinned,
 *   3 locked (50331648 bytes), 0 under the minimum evictee size, 0 not
 *   recomputable)
 * ("no reclaimer installed (nothing was asked to free memory)" in place of
 * what the reclaimer did when there is none; the part from "the DTR engine
 * could not free enough" only when a memscale_dtr_reclaim called during this
 * malloc fell short of its need).
 * An eviction threshold (MEMSCALE_EVICTION_THRESHOLD, memscale_set_threshold)
 * is not enforced here: the DTR engine of the memscale Python package evicts.
 * The first allocation that takes a device's allocated bytes above its
 * threshold while no engine exists (no live memscale_dtr_create handle) logs
 * a warning, once per process, that names the threshold, the allocated bytes
 * and how to enable eviction (python -m memscale run your_script.py, or
 * memscale.enable() in the script).
 * stream must be a stream of device: 0, CU_STREAM_LEGACY (1),
 * CU_STREAM_PER_THREAD (2), or a stream the driver made (on the simulated
 * device, memscale_sim_stream_create); any other handle is refused (NULL, an
 * error naming the handle and what is accepted), as a driver refuses it
 * (CUDA_ERROR_INVALID_HANDLE). */
void* memscale_malloc(ssize_t size, int device, cudaStream_t stream);

/* memscale_malloc for C++ callers that do not check for NULL (PyTorch's
 * CUDAPluggableAllocator): calls memscale_malloc (the fork guard applies)
 * and returns its pointer; when memscale_malloc returns NULL it throws
 * memscale::OutOfMemoryError, a class derived from std::runtime_error, whose
 * what() is "memscale: out of memory: " followed by memscale_last_error()
 * (whatever the failure: out of memory, bad size or device, bad
 * configuration, a forked child). The class's type information is not
 * exported: catch std::runtime_error (or std::exception) outside the
 * library. Call it from C++ only: a C caller cannot catch the exception and
 * the process terminates. */
void* memscale_malloc_or_throw(ssize_t size, int device, cudaStream_t stream);

/* Frees ptr. size is the size that was requested (PyTorch passes it back): a
 * mismatch with the recorded size is reported as an error but the block is
 * still freed. An unknown pointer or a double free is reported and nothing is
 * freed. A stream that memscale_malloc would refuse is reported and nothing
 * is freed. ptr NULL is a no-op. */
void memscale_free(void* ptr, ssize_t size, int device, cudaStream_t stream);

/* PyTorch's init hook: reads the configuration (errors are recorded). */
void memscale_init(int device_count);

/* PyTorch's reset hook (torch.cuda.empty_cache): releases cached memory of
 * every initialised device. */
void memscale_empty_cache(void);

/* torch.cuda.set_per_process_memory_fraction: hard limit = fraction * device
 * memory, fraction in (0, 1]. */
void memscale_set_memory_fraction(double fraction, int device);

/* tensor.record_stream(stream): ptr is not reused until the work queued on
 * stream when ptr is freed has finished. */
void memscale_record_stream(void* ptr, cudaStream_t stream);

/* Simulated device only (MEMSCALE_BACKEND=sim), for tests: makes a stream of
 * device, as cuStreamCreate does on a GPU, and writes its handle to *stream;
 * memscale_malloc, memscale_free and memscale_record_stream accept it until
 * memscale_sim_stream_destroy. 0 on success, -1 on error (NULL stream, a
 * device that is not simulated). */
int memscale_sim_stream_create(int device, cudaStream_t* stream);

/* Destroys a stream made by memscale_sim_stream_create; its handle is then
 * refused. Do not call it while another thread uses the stream. 0 on
 * success, -1 on error (not such a stream, or already destroyed). */
int memscale_sim_stream_destroy(int device, cudaStream_t stream);

/* PyTorch's begin-allocate-to-pool hook (set_begin_allocate_to_pool), called
 * when a CUDA graph capture starts (torch.cuda.graph, torch.compile with
 * mode="reduce-overhead") and by torch.cuda.use_mem_pool, before the capture
 * begins. memscale has no private pools - memory freed inside a graph would
 * be reused while the graph still uses it - so it always throws a
 * std::runtime_error saying so; the capture never starts. PyTorch's C++
 * signature is void(int, MempoolId_t, std::function<bool(cudaStream_t)>):
 * the pair of ids arrives in two registers and the std::function (not
 * trivially copyable) by reference, which is this declaration on x86-64 and
 * aarch64; filter is never touched. Call it from C++ only (like
 * memscale_malloc_or_throw). */
void memscale_begin_allocate_to_pool(int device, unsigned long long pool_id_first, unsigned long long pool_id_second,
                                     const void* filter);

/* ---- statistics, snapshots, limits ------------------------------------- */

/* torch.cuda.memory_stats() keys and memscale's own, as a JSON object. */
char* memscale_stats_json(int device);
/* {"segments":[...],"device_traces":[[...], ...]} of every initialised device,
 * in the shape of torch.cuda.memory._snapshot() (pytorch.org/memory_viz). */
char* memscale_snapshot_json(void);
int memscale_reset_peak_stats(int device);
/* Eviction threshold (DTR budget) in bytes; 0 = none. The allocator only
 * stores it (see memscale_malloc for the warning when nothing evicts). */
int memscale_set_threshold(int device, int64_t bytes);
/* DTR budget in bytes that an engine holds the device's allocated bytes under;
 * 0 = none (the eviction threshold then stands for it). While a budget is
 * known the allocator's cache may keep up to budget x (1 + budget slack)
 * mapped (never past the limit) before it remaps cached granules: a DTR run
 * sits at its budget, and a cache bounded by the allocated high-water mark
 * alone remaps on nearly every miss (docs/allocator-budget.md). */
int memscale_set_budget(int device, int64_t bytes);
/* Budget slack (fraction of the budget the cache may hold beyond it);
 * 0 = the default (0.10), negative = ignore the budget. -1 for NaN/inf. */
int memscale_set_budget_slack(int device, double slack);
/* A training step ended and the next begins (call once per optimizer step,
 * where the step's activations are freed). With a DTR budget known, the
 * allocator turns the step just ended into a placement plan for the next:
 * a step that repeats its requests then remaps no granules
 * (docs/allocator-budget.md, "Step plans"). Without a budget it only counts
 * steps (num_steps in the statistics). -1 on error. */
int memscale_step_boundary(int device);
/* Hard limit on reserved bytes; 0 = the device capacity. */
int memscale_set_limit(int device, int64_t bytes);
/* Allocated bytes now; -1 on error. */
int64_t memscale_allocated(int device);
/* Address of device `device`'s published allocated bytes: a plain int64 that
 * every memscale_malloc and memscale_free on that device rewrites when it
 * returns (0 before the first), readable without a call. A hint for a
 * per-op check that must not cost a call (the DTR region's "is there room?");
 * with several threads allocating it may lag by their last call. Valid for
 * the life of the process; NULL for an ordinal out of range (0..63). */
const int64_t* memscale_allocated_address(int device);
/* Effective configuration (environment, defaults, per-device resolved sizes). */
char* memscale_config_json(void);
/* Whether the library accepted its configuration: NULL when every MEMSCALE_*
 * variable it reads was accepted, else the message naming each rejected
 * variable, its value and what is accepted (the error every allocation then
 * fails with). Static storage, valid while the library is loaded; do not free.
 * The first call reads the environment (as the first malloc would), so call it
 * after setting the variables; the answer never changes afterwards. A caller
 * that installs the allocator should fail when it is not NULL. In a forked
 * child it returns the fork message (the library is not usable there). */
const char* memscale_config_error(void);

/* ---- reclaimer: eviction when an allocation fails ----------------------- */

/* Called by memscale_malloc on device `device`, without any allocator lock
 * held, when a request cannot be met even after cached memory was released:
 * free about `need` bytes (typically by evicting tensors: ask the DTR engine
 * with memscale_dtr_reclaim and drop its victims; it may call memscale_free)
 * and return how many bytes were freed (0: cannot help, the allocation then
 * fails; a negative return counts as 0). memscale_malloc calls it at most 8
 * times per request, again only while it frees something. Allocations on
 * several threads may call it concurrently, each on its own thread. A
 * memscale_malloc made by the reclaimer itself does not call it again (that
 * malloc fails if memory is short). It must return normally: no C++
 * exception or longjmp may leave it. */
typedef int64_t (*memscale_reclaimer)(int device, int64_t need, void* ctx);
/* Installs fn (called with ctx) as the reclaimer of device, replacing any;
 * NULL fn removes it. It applies to the device's allocator now if it exists,
 * else when it is created. fn and ctx must stay valid while an allocation on
 * the device may still call them: removing the reclaimer does not wait for
 * calls in progress. 0, or -1 on error: device out of range, or a reclaimer
 * (fn not NULL) for a device that could not be opened. */
int memscale_set_reclaimer(int device, memscale_reclaimer fn, void* ctx);

/* ---- errors and strings ------------------------------------------------ */

/* The most recent error of the calling thread ("" when none), as errno: each
 * thread sees the errors of its own calls only, whatever other threads do
 * meanwhile. Read it right after the call that failed, on the same thread.
 * The string stays valid and unchanged until at least 7 more errors have been
 * recorded on the same thread (or the thread exits); copy it if you keep it.
 * A call that succeeds does not clear it. */
const char* memscale_last_error(void);
/* Number of errors recorded since the library was loaded, by every thread. */
int memscale_error_count(void);
/* Makes memscale_last_error() return "" on the calling thread (the count is
 * kept). */
void memscale_clear_error(void);
/* Frees a string returned by this library. NULL is a no-op. */
void memscale_string_free(char* s);
/* "memscale X.Y.Z"; static storage. */
const char* memscale_version(void);

/* ---- DTR engine (see DESIGN.md; implemented in cabi/engine.go) ---------- */

/* config_json: {"budget", "heuristic", "recomp_time_factor",
 * "recomp_memory_factor", "evictee_min_size", "swap_bandwidth", "usage",
 * "device", "simulator_compat", "keep_needed_released", "record", "stress",
 * "defaults"} (all optional; unknown keys are an error; NULL or "" = {}).
 * Keys not given take the engine's defaults, with the environment's
 * MEMSCALE_HEURISTIC, MEMSCALE_RECOMP_*_FACTOR and MEMSCALE_EVICTEE_MIN_SIZE
 * over them (read at this call).
 * "keep_needed_released" (default true, as in trace replays): a storage the
 * program released is not evicted at once, nor ranked first, while an
 * evicted storage it still references was computed from it directly.
 * "stress" (default false): a testing setting in which every evictable
 * tensor is evicted as soon as no running op needs it. Call
 * memscale_dtr_evict after every op: it ignores the budget and extra and,
 * after the freed storages, evicts every storage that is resident, unlocked,
 * unpinned, at least "evictee_min_size" bytes and recomputable (or
 * swappable) and that was not rematerialized or swapped in during the
 * engine's life (a storage rebuilt once is not evicted again by stress, so
 * the re-runs stay linear in the program); it never returns -1 for lack of
 * candidates or an extra larger than the budget. A stress engine reports a
 * budget of 0 (status block and stats).
 * "defaults": "region" (the only accepted value) gives the keys not given
 * the DTR region's defaults instead: "evictee_min_size" 1024 bytes
 * (storages smaller are never evicted; 0 with "stress": true) unless
 * MEMSCALE_EVICTEE_MIN_SIZE is set; "heuristic" "auto" (the tuning policy,
 * see memscale_dtr_tune) when "budget" > 0, "stress" is not true and
 * MEMSCALE_HEURISTIC is unset or "auto", the heuristic MEMSCALE_HEURISTIC
 * names when it names another, and the default heuristic with no budget or
 * with stress. Returns a handle > 0, or -1. */
int64_t memscale_dtr_create(const char* config_json);
/* Frees the engine and its status block (memscale_dtr_status_of). */
int memscale_dtr_destroy(int64_t h);
int memscale_dtr_set_budget(int64_t h, int64_t bytes);
int64_t memscale_dtr_tensor(int64_t h, int64_t nbytes, int32_t pinned);
int64_t memscale_dtr_call(int64_t h, const char* name, const int64_t* inputs, int32_t n_in,
                          const int64_t* out_sizes, const int32_t* out_alias, int32_t n_out,
                          int64_t cost_ns, int32_t flags, int64_t* out_ids);
/* One op in one crossing (the plugin's hot path): the releases queued since
 * the last call, then the op exactly as memscale_dtr_call (inputs read, the
 * op registered), then up to cap storages the engine freed handed out as
 * memscale_dtr_evict hands them out first (without its budget loop). frame
 * is an int64 array: frame[0] = r released ids, frame[1] = n_in (-1: only
 * the releases), frame[2] = n_out, frame[3] = cost_ns, frame[4] = flags,
 * frame[5] = cap, then r released ids, n_in inputs, n_out out_sizes and
 * n_out out_alias (as memscale_dtr_call's). On success the engine writes
 * back from frame[0]: n_out output ids, then k (<= cap) the storages handed
 * out, then k pairs (storage-root id, action); the caller sizes frame for
 * both layouts. Returns the op id (0 for releases only), or -1; releases
 * before a failing one are done. Nothing is allocated per call for a name
 * seen before. */
int64_t memscale_dtr_op(int64_t h, const char* name, int64_t* frame);
/* The id of op name `name` on handle h (>= 0; the same id for the same name),
 * for memscale_dtr_ops' records; -1 on error. */
int64_t memscale_dtr_name(int64_t h, const char* name);
/* Many ops in one crossing: what memscale_dtr_op does for one op, for n
 * records in order, the caller having predicted each op's ids (the status
 * block's next_op and next_tensor, counted on). frame[0] = n records,
 * frame[1] = cap, then the records, each a header of 8 words - name id
 * (memscale_dtr_name), r released ids, n_in (-1: only the releases),
 * n_out, cost_ns, flags, the op id expected, the first output id expected
 * (the outputs take it and the ids after it) - and its body as
 * memscale_dtr_op's: r released ids, n_in inputs, n_out out_sizes, n_out
 * out_alias. A record of releases only has n_out, cost_ns, flags and the
 * expected ids 0. An op that gets other ids than expected fails the call.
 * On success the engine writes back frame[0] = k (<= cap) storages handed
 * out and k pairs (storage-root id, action) after it, and returns n. On
 * error returns -1, the records before the failing one done (the message
 * names the record and its op). */
int64_t memscale_dtr_ops(int64_t h, int64_t* frame);
int64_t memscale_dtr_mutate(int64_t h, const char* name, const int64_t* inputs, int32_t n_in,
                            const int32_t* mutated, int32_t n_mut, int64_t cost_ns,
                            int32_t flags, int64_t* out_ids);
int memscale_dtr_access(int64_t h, int64_t t);
int memscale_dtr_lock(int64_t h, int64_t t);
int memscale_dtr_unlock(int64_t h, int64_t t);
int memscale_dtr_pin(int64_t h, int64_t t);
int memscale_dtr_release(int64_t h, int64_t t);
/* The budget loop. extra (>= 0; negative is an error) is the number of bytes
 * the caller is about to allocate (an op's outputs, a re-run, a swap-in): it
 * makes room until usage + extra <= budget. Writes up to cap (> 0) victims
 * as (storage-root tensor id, action: 0 = drop, 1 = swap to host): first the
 * storages freed since the last call (released by the program, or
 * throw-away copies re-made by a re-run, see memscale_dtr_rematerialized),
 * then, while usage + extra > budget, victims chosen by the heuristic. The
 * engine already counts every victim gone; the caller frees its storage
 * (for a swap, after copying it to host memory), every view of it included.
 * Returns:
 *   cap           there may be more: call again;
 *   0 < n < cap   usage + extra is within the budget, OR the engine ran out
 *                 of candidates after writing these n while it is still over
 *                 the budget (those victims must still be freed); the next
 *                 call tells which: 0 or -1;
 *   0             usage + extra is within the budget (or there is no
 *                 budget) and nothing freed is left to hand out;
 *   -1            usage + extra is over the budget and nothing (more) can be
 *                 evicted: the error names usage, budget and what keeps the
 *                 resident storages (pins, locks, plan holds, minimum size);
 *                 or, with a budget > 0, extra alone is larger than the
 *                 budget: it fails at once, evicting and handing out nothing,
 *                 with "an allocation of N bytes is larger than the whole
 *                 budget of B bytes: raise the budget above N plus the
 *                 pinned bytes (P now)"; or a bad argument.
 *                 In both failures, when the budget is below what the step
 *                 needs at this point (the pinned storages, the locked ones
 *                 and extra), the error says so first, e.g. (one line)
 *                   memscale_dtr_evict: evict: budget 41.0 MiB is below what
 *                   this step needs at this point: 44.9 MiB pinned at
 *                   registration (parameters, inputs) + 44.9 MiB pinned later
 *                   (gradients) + 77.1 MiB locked by the running op +
 *                   10.0 MiB requested; the step's minimum budget so far is
 *                   170.0 MiB (largest op: native_batch_norm_backward); usage
 *                   ... (the details above)
 *                 ("(this point)" in place of the largest op when this point
 *                 needs more than any op so far; see "min_budget" in
 *                 memscale_dtr_stats_json).
 * So it returns fewer victims than needed without an error only when it wrote
 * at least one in that call; a caller that needs usage + extra <= budget
 * calls it until it returns 0 or -1. After memscale_dtr_finish it never
 * returns -1 for lack of candidates nor for an extra larger than the budget:
 * it evicts what it can and returns (0 or the victims it wrote) even when
 * usage + extra stays over the budget. With "stress": true it ignores the
 * budget (see memscale_dtr_create) and never returns -1 but for a bad
 * argument. With "usage": "allocator", free the
 * victims of a call before the next call (within a call the engine discounts
 * the victims it wrote from the allocator's count; across calls it reads
 * the allocator). */
int32_t memscale_dtr_evict(int64_t h, int64_t extra, int64_t* ids, int32_t* actions, int32_t cap);
/* Eviction on demand, for a reclaimer (memscale_set_reclaimer): like
 * memscale_dtr_evict (the same arrays, victims and duties: first the
 * storages freed since the last call, then victims chosen by the heuristic;
 * free each victim's storage), but ignoring the budget: it evicts victims
 * until the sizes of those written (the freed storages included) sum to at
 * least need (>= 0; negative is an error), or nothing more is evictable.
 * Returns the count written, 0 to cap (> 0). A return of cap leaves the
 * reclaim open: call again with the same need (the bytes already written
 * count toward it) until it returns less than cap; a memscale_dtr_evict
 * closes an open reclaim. Falling short of need is not an error: the call
 * returns what it found (possibly 0) and records the engine's reason
 * (what keeps the resident storages: pins, locks, plan holds, minimum size)
 * as the process's reclaim shortfall, which the error of a memscale_malloc
 * that fails after it includes. The victims count in bytes_evicted (status
 * block and stats), and in stats' "reclaim_victims". -1 on a bad argument
 * or an unknown handle. */
int32_t memscale_dtr_reclaim(int64_t h, int64_t need, int64_t* ids, int32_t* actions, int32_t cap);
/* The steps that make tensor t resident, evicted ancestors first: kinds[i]
 * 0 = re-run op ids[i] (afterwards report memscale_dtr_rematerialized), 1 =
 * copy swapped storage ids[i] back (memscale_dtr_swapped_in). Returns the
 * number of steps n (0: t is resident), as snprintf does: when n > cap
 * (cap 0 with NULL arrays asks for the count) it writes nothing, commits
 * nothing and records no error; call again with cap >= n (the plan may have
 * changed by then if other calls came between: use the new count). -1 only
 * on an error: unknown handle or tensor, a negative cap, NULL arrays with
 * cap >= n > 0, or t cannot be rebuilt. A plan of 0 < n <= cap steps is
 * committed: run its steps in order. The engine locks the inputs of the first
 * re-run step not reported yet, and nothing else; reporting that step moves
 * the lock to the next re-run step. An input of a later step may be evicted
 * while earlier steps run: before running a step, rebuild any input that is
 * not resident with a plan of its own (plans nest; a report advances the
 * innermost plan whose current step it is). */
int32_t memscale_dtr_plan(int64_t h, int64_t t, int32_t* kinds, int64_t* ids, int32_t cap);

/* Forgets every committed plan not run to the end, innermost first: the
 * locks they hold on the inputs of their next step and their holds on the
 * inputs of later steps go, as if those steps had been reported (nothing is
 * evicted or rebuilt). For a caller that stops running its plans: a rebuild
 * that failed for room and starts over, or an error that goes to the
 * program. Returns the number of plans forgotten, or -1 (unknown handle). */
int memscale_dtr_abandon_plans(int64_t h);
/* Parks the storage of tensor t: copies it to host memory although it may be
 * locked (the caller copies it out when this returns 1, as for a swap victim
 * of memscale_dtr_evict). For a nested rebuild that found nothing evictable:
 * what the outer levels of the rebuild hold (the running op's resident
 * inputs, the inputs of outer plans' held steps) is not read until the inner
 * rebuild is done. Locks stay; the holder checks residency before reading the
 * storage and swaps it back in (memscale_dtr_plan gives a swap-in step).
 * Parking is on when the configuration's "park" is true.
 * Returns 1 (parked), 0 (not parked: parking off, or the storage is not
 * resident, pinned, empty, or over the offload limit) or -1 (unknown handle
 * or tensor). */
int memscale_dtr_park(int64_t h, int64_t t);
/* Op op was re-run (its inputs were resident), taking cost_ns. Its outputs are
 * resident again, except outputs whose storage the program released for good
 * (a dropped output of a multi-output op): the re-run's copies of those are
 * thrown away, handed out by the next memscale_dtr_evict as drops. */
int memscale_dtr_rematerialized(int64_t h, int64_t op, int64_t cost_ns);
/* The swapped storage of t was copied back (a swap-in step, or on demand). */
int memscale_dtr_swapped_in(int64_t h, int64_t t);
/* The program's step is over and the caller is about to make every tensor
 * that escapes it resident, whatever the budget. From then on
 * memscale_dtr_evict evicts what it can and never fails for lack of
 * candidates or for an extra larger than the budget; the overshoot shows in
 * peak_usage. Calling it again is allowed and changes nothing. Returns 0, or
 * -1 for an unknown handle. */
int memscale_dtr_finish(int64_t h);

/* The engine's state as of the end of the last call on the handle: five
 * int64_t fields in this order and nothing else (Python reads it with
 * ctypes from_address). */
typedef struct memscale_dtr_status {
    int64_t usage;         /* bytes in use at the end of the last call on this handle;
                              with "usage": "allocator", the allocator's count at that
                              moment (allocations made since are not in it) */
    int64_t budget;        /* bytes, 0 = unlimited (and 0 for a "stress" engine) */
    int64_t pending;       /* storages the engine freed (released, banished, throw-away
                              copies) not yet handed out by memscale_dtr_evict */
    int64_t bytes_evicted; /* bytes of budget victims so far (drops and swaps out; not
                              storages freed because the program released them) */
    int64_t peak_usage;    /* the highest count of resident registered bytes so far (the
                              engine's own count, also with "usage": "allocator") */
    int64_t next_op;       /* the id the next registered op gets (ids run in sequence) */
    int64_t next_tensor;   /* the id the next registered tensor gets: an op's outputs,
                              a mutation's new versions and externals take the next ids
                              in order (what memscale_dtr_ops' records must expect) */
} memscale_dtr_status;

/* The status block of engine h, kept current by the engine: it is rewritten
 * at the end of every call on the handle (memscale_dtr_create and every
 * memscale_dtr_* call taking h, failed calls included), so a caller can skip
 * memscale_dtr_evict when pending is 0 and usage + the bytes it is about to
 * allocate is within budget (or budget is 0). Read it on the thread that makes
 * the calls on h, between calls. The pointer stays valid, at the same
 * address, until memscale_dtr_destroy(h); do not free it. NULL (and an
 * error) for an unknown handle. */
const memscale_dtr_status* memscale_dtr_status_of(int64_t h);

/* The engine's counters as JSON (free with memscale_string_free; NULL on
 * error): "evictions", "eager_evictions", "banished", "rematerializations",
 * "swaps_out", "swaps_in", "base_cost_ns", "remat_cost_ns", "swap_cost_ns",
 * "clock", "usage", "peak_usage", "budget", "candidates", "victim_searches",
 * "victim_search_ns", "tensors", "storages", "ops", "heuristic" (the one
 * scoring), "bytes_evicted" (as in memscale_dtr_status), "auto" (created
 * with heuristic "auto": it records this step for memscale_dtr_tune),
 * "finished" (memscale_dtr_finish was called), "min_budget" and
 * "min_budget_parts" (below), and "config": the
 * configuration the engine runs with, after defaults, as memscale_dtr_create
 * keys: "budget", "heuristic" (as configured: "auto" for the tuning policy),
 * "recomp_time_factor" and "recomp_memory_factor" (omitted when unset),
 * "evictee_min_size", "swap_bandwidth" (omitted when 0), "usage" ("engine"
 * or "allocator"), "device" (with "allocator"), "simulator_compat",
 * "keep_needed_released", "record", "stress".
 * "min_budget" is the step's minimum budget so far, in bytes: a lower bound
 * below which no budget can run the step. At every op (memscale_dtr_call:
 * inputs and outputs; memscale_dtr_mutate: inputs, whose memory the new
 * versions take over; memscale_dtr_rematerialized: the re-run's inputs and
 * outputs) the engine adds up what is resident together then: the pinned
 * resident storages and the op's own distinct storages that are not pinned;
 * "min_budget" is the largest such sum, and "min_budget_parts" its parts:
 * {"pinned_at_registration": bytes of the storages pinned by
 * memscale_dtr_tensor (parameters, inputs), "pinned_later": bytes of those
 * pinned by memscale_dtr_pin (gradients), "op_bytes": the op's own bytes,
 * "op": the op's name ("" before the first op)}; "min_budget" is their sum
 * (0 before the first op). It is tracked with or without a budget: an
 * engine with no budget measures it. */
char* memscale_dtr_stats_json(int64_t h);
/* Choose the configuration for the steps to come: replay the program this
 * engine recorded (created with "heuristic": "auto" or "record": true) under
 * its budget with every candidate configuration (each heuristic with the
 * exponents recomp_time_factor and recomp_memory_factor in {0.5, 1, 2}; 52 in
 * all) and return JSON:
 * {"config": {the keys to merge into the next memscale_dtr_create},
 *  "choice": name, "feasible": bool, "overhead": the choice's,
 *  "default_overhead": the default heuristic's (0 = it did not finish),
 *  "budget", "instructions", "wall_ns", "trials": [{"candidate", "status",
 *  "overhead"}]}. Free it with memscale_string_free. NULL on error: an engine
 * that does not record, no budget, a recording that could not follow the
 * program. It runs for as long as the replays take (milliseconds to seconds);
 * call it when the step is over. */
char* memscale_dtr_tune(int64_t h);

#ifdef __cplusplus
}
#endif

#endif /* MEMSCALE_H */
