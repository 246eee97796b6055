/* block_io.bpf.c: block request latency and size per device.
 * Loader: bpf/block_io.py (class BlockIo).
 *
 *   ISSUE_TP (block:block_rq_issue, or block:block_io_start on the fallback)
 *       issued[dev, sector] = {time, bytes}; requests without data (flushes)
 *       are not tracked
 *   DONE_TP (block:block_rq_complete, or block:block_io_done)
 *       lat_hist[dev, slot(now - issue time, us)] += 1
 *       size_hist[dev, log2(bytes)]              += 1
 * Completion runs in interrupt or softirq context, so requests are matched by
 * device and start sector, never by task. The loader reads and deletes both
 * histograms once per interval; the request count is the size histogram's
 * total and the small-I/O share is read from its power-of-two slots, so the
 * threshold is a loader parameter, not a compile-time constant.
 *
 * Latency slots are log-linear (hist_slot in reflexarc_common.h), HIST_SLOTS in
 * all; size slots are floor(log2 bytes).
 *
 * cflags: -DMAX_DEVS -DMAX_INFLIGHT -DHIST_SLOTS -DISSUE_TP=... -DDONE_TP=...
 */
#include <uapi/linux/ptrace.h>
#include "reflexarc_common.h"

struct rq_key { u32 dev; u32 pad; u64 sector; };
struct rq_val { u64 ts; u32 bytes; u32 pad; };

BPF_TABLE("lru_hash", struct rq_key, struct rq_val, issued, MAX_INFLIGHT);
BPF_HASH(lat_hist, struct hist_key, u64, MAX_DEVS * 64);
BPF_HASH(size_hist, struct hist_key, u64, MAX_DEVS * 33);

#define TP_ARGS_(event) struct tracepoint__block__##event
#define TP_ARGS(event) TP_ARGS_(event)

int on_issue(TP_ARGS(ISSUE_TP) *args)
{
    u32 bytes = args->bytes;
    if (bytes == 0)
        return 0;
    struct rq_key k = {.dev = args->dev, .sector = args->sector};
    struct rq_val v = {.ts = bpf_ktime_get_ns(), .bytes = bytes};
    issued.update(&k, &v);
    return 0;
}

int on_done(TP_ARGS(DONE_TP) *args)
{
    struct rq_key k = {.dev = args->dev, .sector = args->sector};
    struct rq_val *v = issued.lookup(&k);
    if (!v)
        return 0;
    u64 delta = bpf_ktime_get_ns() - v->ts;
    struct hist_key lat = {.id = k.dev, .slot = hist_slot(delta / 1000)};
    struct hist_key size = {.id = k.dev, .slot = bpf_log2l(v->bytes) - 1};
    issued.delete(&k);
    lat_hist.atomic_increment(lat);
    size_hist.atomic_increment(size);
    return 0;
}
