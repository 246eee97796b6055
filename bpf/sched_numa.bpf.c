/* sched_numa.bpf.c: CPU migrations (and NUMA crossings) and run-queue latency
 * of selected processes' threads.
 * Loader: bpf/sched_numa.py (class SchedNuma).
 *
 * Wakeups and migrations run in another task's context, so the program keeps
 * the set of watched threads itself: tasks[tid] = tgid. Each thread is
 * re-tested against the selection (tgid in sel_pid, or cgroup in sel_cgroup
 * when SEL_CGROUPS is set) whenever it is switched out, which every thread is
 * before it can be woken or migrated, and is added or removed accordingly; a
 * selection change takes effect within one scheduling period per thread. The
 * loader also writes the threads of selected pids at once, and
 * sched_process_exit removes exiting threads. Names (sel_comm) are resolved to
 * tgids by the loader's /proc scan and by on_rename (reflexarc_common.h), never
 * per event.
 *
 *   sched:sched_migrate_task  watched tid: migrations[tgid].all += 1, and
 *                             when cpu_node[orig] != cpu_node[dest]: .cross
 *                             += 1 and one struct numa_event into the ring
 *                             buffer numa_events (events_lost[0] += 1 when it
 *                             is full)
 *   sched:sched_wakeup(_new)  watched tid: queued_at[tid] = now
 *   sched:sched_switch        prev watched and still runnable (preempted):
 *                             queued_at[prev] = now;
 *                             next watched: runq_hist[tgid, slot(now -
 *                             queued_at[next], us)] += 1
 * The loader reads and deletes migrations and runq_hist once per interval, and
 * polls numa_events without blocking; events_lost is a running count.
 * cpu_node is written by the loader from reflexarc.core.topology (map
 * update, no recompile); -1 marks an unknown CPU, never counted as a crossing.
 *
 * Histogram slots are log-linear (hist_slot in reflexarc_common.h), HIST_SLOTS
 * in all.
 *
 * The task name in an event is the tracepoint's comm field: a __data_loc
 * string on newer kernels (COMM_DATA_LOC defined), a char[16] before.
 *
 * cflags: -DMAX_SELECTED -DMAX_PIDS -DMAX_THREADS -DMAX_CPUS -DHIST_SLOTS
 *         -DRING_PAGES (a power of two) [-DCOMM_DATA_LOC]
 */
#include <uapi/linux/ptrace.h>

#define WITH_SELECTION
#include "reflexarc_common.h"

/* sched_switch reports a preempted task as TASK_REPORT_MAX (0x100 since 4.14,
 * above every sleeping state bit) and a task that yielded as 0. */
#define SLEEP_STATE_BITS 0xff

struct mig { u64 all; u64 cross; };

/* A cross-NUMA migration of a watched thread; mirrored by NumaEvent in
 * bpf/sched_numa.py. */
struct numa_event {
    u64 ts_ns;                            /* bpf_ktime_get_ns: CLOCK_MONOTONIC */
    u32 tgid;
    u32 tid;
    s32 orig_cpu;
    s32 dest_cpu;
    s32 orig_node;
    s32 dest_node;
    char comm[16];
};

BPF_TABLE("lru_hash", u32, u32, tasks, MAX_THREADS);
BPF_TABLE("lru_hash", u32, u64, queued_at, MAX_THREADS);
BPF_ARRAY(cpu_node, s32, MAX_CPUS);
BPF_HASH(migrations, u32, struct mig, MAX_PIDS);
BPF_HASH(runq_hist, struct hist_key, u64, MAX_PIDS * 32);
BPF_RINGBUF_OUTPUT(numa_events, RING_PAGES);
BPF_PERCPU_ARRAY(events_lost, u64, 1);

static __always_inline s32 node_of(int cpu)
{
    u32 idx = cpu;
    s32 *node = cpu_node.lookup(&idx);
    return node ? *node : -1;
}

static __always_inline void count_lost(void)
{
    u32 zero = 0;
    u64 *lost = events_lost.lookup(&zero);
    if (lost)
        *lost += 1;                       /* per-CPU slot: no other writer */
}

int on_migrate(struct tracepoint__sched__sched_migrate_task *args)
{
    u32 tid = args->pid;
    u32 *known = tasks.lookup(&tid);
    if (!known)
        return 0;
    u32 tgid = *known;
    s32 from = node_of(args->orig_cpu), to = node_of(args->dest_cpu);
    int cross = from >= 0 && to >= 0 && from != to;
    struct mig zero = {};
    struct mig *m = migrations.lookup_or_try_init(&tgid, &zero);
    if (m) {
        __sync_fetch_and_add(&m->all, 1);
        if (cross)
            __sync_fetch_and_add(&m->cross, 1);
    }
    if (!cross)
        return 0;

    struct numa_event *e = numa_events.ringbuf_reserve(sizeof(struct numa_event));
    if (!e) {
        count_lost();
        return 0;
    }
    e->ts_ns = bpf_ktime_get_ns();
    e->tgid = tgid;
    e->tid = tid;
    e->orig_cpu = args->orig_cpu;
    e->dest_cpu = args->dest_cpu;
    e->orig_node = from;
    e->dest_node = to;
#ifdef COMM_DATA_LOC
    TP_DATA_LOC_READ_STR(e->comm, comm, sizeof(e->comm));
#else
    bpf_probe_read_kernel_str(e->comm, sizeof(e->comm), args->comm);
#endif
    numa_events.ringbuf_submit(e, 0);
    return 0;
}

/* Attached to sched_wakeup and sched_wakeup_new: they share this layout. */
int on_wakeup(struct tracepoint__sched__sched_wakeup *args)
{
    u32 tid = args->pid;
    if (!tasks.lookup(&tid))
        return 0;
    u64 now = bpf_ktime_get_ns();
    queued_at.update(&tid, &now);
    return 0;
}

int on_switch(struct tracepoint__sched__sched_switch *args)
{
    u32 prev = args->prev_pid, next = args->next_pid;

    if (prev != 0) {                      /* current is prev here */
        u32 tgid = bpf_get_current_pid_tgid() >> 32;
        if (selected(tgid)) {
            u32 *known = tasks.lookup(&prev);
            if (!known || *known != tgid)
                tasks.update(&prev, &tgid);
            if ((args->prev_state & SLEEP_STATE_BITS) == 0) {
                u64 now = bpf_ktime_get_ns();
                queued_at.update(&prev, &now);
            }
        } else if (tasks.lookup(&prev)) {
            tasks.delete(&prev);          /* no longer selected */
        }
    }

    if (next != 0) {
        u32 *tgid = tasks.lookup(&next);
        if (!tgid)
            return 0;
        u64 *queued = queued_at.lookup(&next);
        if (!queued)
            return 0;
        u64 now = bpf_ktime_get_ns();
        struct hist_key hk = {.id = *tgid, .slot = hist_slot((now - *queued) / 1000)};
        queued_at.delete(&next);
        runq_hist.atomic_increment(hk);
    }
    return 0;
}

int on_exit(void *ctx)
{
    u32 tid = bpf_get_current_pid_tgid();
    tasks.delete(&tid);
    queued_at.delete(&tid);
    return 0;
}
