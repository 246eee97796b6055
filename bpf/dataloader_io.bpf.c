/* dataloader_io.bpf.c: read latency of selected processes (DataLoader workers).
 * Loader: bpf/dataloader_io.py (class DataloaderIo).
 *
 * Two sources, each compiled in only when the loader found its tracepoints:
 *   read syscalls (READ_SYSCALLS): sys_enter_{read,pread64,readv,preadv,preadv2,
 *       recvfrom,recvmsg} (socket receives: items fetched from an object store)
 *       store the entry time per thread; the matching sys_exit records
 *       exit - entry for reads that returned >= 0.
 *   io_uring (URING_SUBMIT_REQ, or URING_SUBMIT_SQE on older kernels):
 *       the submit tracepoint, which runs in the submitting task (or its SQPOLL
 *       thread, same tgid), stores {time, tgid} keyed by the request pointer;
 *       io_uring_complete, which may run in io-wq or interrupt context, looks
 *       the request up and attributes the latency to the submitter.
 * Each completed read adds lat_hist[tgid, slot(latency in microseconds)] += 1;
 * the loader reads and deletes it once per interval, and counts reads as the
 * histogram's total.
 *
 * Read amplification (BLOCK_BIO_QUEUE): a file read that returned n > 0 bytes
 * (read, pread64, readv, preadv, preadv2: on_read_exit; receives, on_recv_exit,
 * are not file data) adds n to io_bytes[{tgid, dev 0}]; a read bio queued on a
 * block device while a selected task runs (block:block_bio_queue: the reading
 * task submits the bios of its own page-cache misses and of their readahead)
 * adds its bytes to io_bytes[{tgid, dev}]. The loader keeps the devices at the
 * top of their stack, so a dm device's bio is not counted again on the disk
 * below it. io_bytes is running, never deleted by the kernel.
 *
 * Selection (map updates, no recompile): sel_mode[0] == 0 watches every process;
 * otherwise a task is selected when its tgid is in sel_pid or, with SEL_CGROUPS
 * set, its cgroup id in sel_cgroup. Names (sel_comm) are resolved to tgids by
 * the loader's /proc scan and by on_rename (reflexarc_common.h), never per
 * event. Only the submitting/reading side is filtered; completions are matched
 * by key.
 *
 * Histogram slots are log-linear (hist_slot in reflexarc_common.h), HIST_SLOTS
 * in all.
 *
 * cflags: -DMAX_SELECTED -DMAX_PIDS -DMAX_THREADS -DMAX_INFLIGHT -DHIST_SLOTS
 *         [-DREAD_SYSCALLS] [-DURING_SUBMIT_REQ | -DURING_SUBMIT_SQE] [-DBLOCK_BIO_QUEUE]
 */
#include <uapi/linux/ptrace.h>

#define WITH_SELECTION
#include "reflexarc_common.h"

struct inflight { u64 ts; u32 tgid; u32 pad; };

BPF_HASH(lat_hist, struct hist_key, u64, MAX_PIDS * 32);

/* {tgid, dev}: dev 0 holds the bytes its file reads returned, any other the
 * bytes of the read bios it queued on that device (dev_t as the kernel's). */
struct io_key { u32 tgid; u32 dev; };
BPF_HASH(io_bytes, struct io_key, u64, MAX_PIDS * 8);

static __always_inline void add_bytes(u32 tgid, u32 dev, u64 n)
{
    struct io_key k = {.tgid = tgid, .dev = dev};
    u64 zero = 0;
    u64 *v = io_bytes.lookup_or_try_init(&k, &zero);
    if (v)
        __sync_fetch_and_add(v, n);
}

static __always_inline void record(u32 tgid, u64 delta_ns)
{
    struct hist_key hk = {.id = tgid, .slot = hist_slot(delta_ns / 1000)};
    lat_hist.atomic_increment(hk);
}

#ifdef READ_SYSCALLS
/* A plain hash: every entry is deleted by its sys_exit, which always follows. */
BPF_HASH(read_start, u64, u64, MAX_THREADS);

int on_read_enter(void *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!selected(id >> 32))
        return 0;
    u64 now = bpf_ktime_get_ns();
    read_start.update(&id, &now);
    return 0;
}

static __always_inline int read_exit(long ret, int file_data)
{
    u64 id = bpf_get_current_pid_tgid();
    u64 *start = read_start.lookup(&id);
    if (!start)
        return 0;
    u64 delta = bpf_ktime_get_ns() - *start;
    read_start.delete(&id);
    if (ret >= 0)
        record(id >> 32, delta);
    if (file_data && ret > 0)
        add_bytes(id >> 32, 0, (u64)ret);
    return 0;
}

/* Attached to every sys_exit_* read variant: they share this layout. */
int on_read_exit(struct tracepoint__syscalls__sys_exit_read *args)
{
    return read_exit(args->ret, 1);
}

/* Attached to the receives' sys_exit (the same layout; another type, since bcc
 * generates one struct per tracepoint named). */
int on_recv_exit(struct tracepoint__syscalls__sys_exit_recvfrom *args)
{
    return read_exit(args->ret, 0);
}
#endif

#ifdef BLOCK_BIO_QUEUE
int on_bio_queue(struct tracepoint__block__block_bio_queue *args)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (!selected(tgid))
        return 0;
    char rw[2] = {};
    bpf_probe_read_kernel(&rw, sizeof(rw), args->rwbs);
    if (!(rw[0] == 'R' || (rw[0] == 'F' && rw[1] == 'R')))   /* "R", "RA", "RS", "FR": reads */
        return 0;
    u32 dev = args->dev;
    if (dev)
        add_bytes(tgid, dev, (u64)args->nr_sector << 9);
    return 0;
}
#endif

#if defined(URING_SUBMIT_REQ) || defined(URING_SUBMIT_SQE)
/* LRU: requests cancelled with their ring never complete. */
BPF_TABLE("lru_hash", u64, struct inflight, uring_inflight, MAX_INFLIGHT);

#ifdef URING_SUBMIT_REQ
int on_uring_submit(struct tracepoint__io_uring__io_uring_submit_req *args)
#else
int on_uring_submit(struct tracepoint__io_uring__io_uring_submit_sqe *args)
#endif
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (!selected(tgid))
        return 0;
    u64 req = (u64)args->req;
    struct inflight v = {.ts = bpf_ktime_get_ns(), .tgid = tgid};
    uring_inflight.update(&req, &v);
    return 0;
}

int on_uring_complete(struct tracepoint__io_uring__io_uring_complete *args)
{
    u64 req = (u64)args->req;
    struct inflight *v = uring_inflight.lookup(&req);
    if (!v)
        return 0;
    u64 delta = bpf_ktime_get_ns() - v->ts;
    u32 tgid = v->tgid;
    uring_inflight.delete(&req);
    record(tgid, delta);
    return 0;
}
#endif
