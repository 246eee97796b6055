/* rdma_qp.bpf.c: RDMA queue-pair post -> completion latency (deep tier).
 * Loader: bpf/rdma_qp.py (class RdmaQp).
 *
 * Attached as uprobes on a user-space verbs provider (or a library with the
 * same post/poll signatures):
 *   on_post        uprobe    int post(struct ibv_qp *qp, struct ibv_send_wr *wr, ...)
 *                  each work request of the chain (at most MAX_WR_CHAIN):
 *                  inflight[tgid, context, qp_num, wr_id] = now
 *   on_poll        uprobe    int poll(struct ibv_cq *cq, int n, struct ibv_wc *wc)
 *                  polls[tid] = {cq context, wc}
 *   on_poll_return uretprobe for each returned completion (at most MAX_WC):
 *                  lat_hist[tgid, context, qp_num, slot] += 1 when it was in flight
 * ctx_name[tgid, context] keeps the device name read at the first post.
 * events[0] counts program runs (the deep tier's cost, per CPU).
 *
 * Only user memory is read, at offsets of the libibverbs ABI given as cflags;
 * never a kernel structure. The loader reads and deletes lat_hist per interval.
 * Histogram slots are log-linear (hist_slot in reflexarc_common.h), HIST_SLOTS
 * in all.
 *
 * cflags: -DMAX_INFLIGHT -DMAX_QPS -DMAX_WC -DMAX_WR_CHAIN -DHIST_SLOTS
 *         -DQP_CONTEXT_OFF -DQP_NUM_OFF -DCQ_CONTEXT_OFF -DCTX_DEVICE_OFF
 *         -DDEV_NAME_OFF -DWR_ID_OFF -DWR_NEXT_OFF -DWC_SIZE -DWC_WR_ID_OFF
 *         -DWC_STATUS_OFF -DWC_QP_NUM_OFF
 */
#include <uapi/linux/ptrace.h>
#include "reflexarc_common.h"

#define DEV_NAME_LEN 32

struct wr_key {
    u64 context;
    u64 wr_id;
    u32 tgid;
    u32 qp_num;
};

struct qp_hist_key {
    u64 context;
    u32 tgid;
    u32 qp_num;
    u32 slot;
    u32 pad;
};

struct ctx_key {
    u64 context;
    u32 tgid;
    u32 pad;
};

struct dev_name { char name[DEV_NAME_LEN]; };

struct poll_args {
    u64 context;
    u64 wc;
};

BPF_TABLE("lru_hash", struct wr_key, u64, inflight, MAX_INFLIGHT);
BPF_TABLE("lru_hash", struct ctx_key, struct dev_name, ctx_name, MAX_QPS);
BPF_TABLE("lru_hash", u32, struct poll_args, polls, 4096);   /* a thread killed mid-poll ages out */
BPF_HASH(lat_hist, struct qp_hist_key, u64, MAX_QPS * 64);
BPF_PERCPU_ARRAY(events, u64, 1);

static __always_inline void count_event(void)
{
    u32 zero = 0;
    u64 *n = events.lookup(&zero);
    if (n)
        (*n)++;                            /* per-CPU slot: no atomic needed */
}

static __always_inline u64 read_ptr(u64 base, u32 off)
{
    u64 v = 0;
    bpf_probe_read_user(&v, sizeof(v), (void *)(base + off));
    return v;
}

static __always_inline u32 read_u32(u64 base, u32 off)
{
    u32 v = 0;
    bpf_probe_read_user(&v, sizeof(v), (void *)(base + off));
    return v;
}

int on_post(struct pt_regs *ctx)
{
    count_event();
    u64 qp = PT_REGS_PARM1(ctx), wr = PT_REGS_PARM2(ctx);
    if (!qp)
        return 0;
    u64 now = bpf_ktime_get_ns();
    struct wr_key k = {};
    k.tgid = bpf_get_current_pid_tgid() >> 32;
    k.context = read_ptr(qp, QP_CONTEXT_OFF);
    k.qp_num = read_u32(qp, QP_NUM_OFF);

    struct ctx_key ck = {.context = k.context, .tgid = k.tgid};
    if (!ctx_name.lookup(&ck)) {
        struct dev_name dn = {};
        u64 dev = read_ptr(k.context, CTX_DEVICE_OFF);
        bpf_probe_read_user_str(dn.name, sizeof(dn.name), (void *)(dev + DEV_NAME_OFF));
        ctx_name.update(&ck, &dn);
    }

    for (int i = 0; i < MAX_WR_CHAIN; i++) {
        if (!wr)
            break;
        k.wr_id = read_ptr(wr, WR_ID_OFF);
        inflight.update(&k, &now);
        wr = read_ptr(wr, WR_NEXT_OFF);
    }
    return 0;
}

int on_poll(struct pt_regs *ctx)
{
    count_event();
    u64 cq = PT_REGS_PARM1(ctx);
    struct poll_args a = {.context = read_ptr(cq, CQ_CONTEXT_OFF), .wc = PT_REGS_PARM3(ctx)};
    u32 tid = bpf_get_current_pid_tgid();
    polls.update(&tid, &a);
    return 0;
}

int on_poll_return(struct pt_regs *ctx)
{
    count_event();
    u32 tid = bpf_get_current_pid_tgid();
    struct poll_args *a = polls.lookup(&tid);
    if (!a)
        return 0;
    struct poll_args args = *a;
    polls.delete(&tid);
    int got = PT_REGS_RC(ctx);
    if (got <= 0)
        return 0;
    u64 now = bpf_ktime_get_ns();
    struct wr_key k = {.context = args.context, .tgid = bpf_get_current_pid_tgid() >> 32};

    for (int i = 0; i < MAX_WC; i++) {
        if (i >= got)
            break;
        u64 wc = args.wc + (u64)i * WC_SIZE;
        k.wr_id = read_ptr(wc, WC_WR_ID_OFF);
        k.qp_num = read_u32(wc, WC_QP_NUM_OFF);
        u64 *posted = inflight.lookup(&k);
        if (!posted)
            continue;                      /* a receive, or posted before attach */
        u64 lat_us = (now - *posted) / 1000;
        inflight.delete(&k);
        if (read_u32(wc, WC_STATUS_OFF) != 0)
            continue;                      /* failed or flushed: not a latency */
        struct qp_hist_key hk = {.context = k.context, .tgid = k.tgid,
                                 .qp_num = k.qp_num, .slot = hist_slot(lat_us)};
        lat_hist.atomic_increment(hk);
    }
    return 0;
}
