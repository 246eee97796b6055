/* sched_numa.bpf.c: CPU migrations (and NUMA crossings), run-queue latency and
 * on-CPU time per NUMA node of selected processes' threads.
 * Loader: bpf/sched_numa.py (class SchedNuma).
 *
 * Wakeups and migrations run in another task's context, so the program keeps
 * the set of watched threads itself: tasks[tid] = {tgid, ran_at}. Each thread
 * is re-tested against the selection (tgid in sel_pid, or cgroup in sel_cgroup
 * when SEL_CGROUPS is set) whenever it is switched out, which every thread is
 * before it can be woken or migrated, and is added or removed accordingly; a
 * selection change takes effect within one scheduling period per thread. The
 * loader also writes the threads of selected pids not yet watched at once, and
 * sched_process_exit removes exiting threads for good: a selected one goes into
 * exiting[tid] = tgid, and is not watched again on its way out (it still
 * switches, and may be preempted, after the tracepoint), so nothing is counted
 * for a thread after its exit, which the proc_exit probe reports at that
 * tracepoint too. sched_wakeup_new clears exiting[tid] for the new task that
 * reuses a tid. Names (sel_comm) are resolved to tgids by the loader's /proc
 * scan and by on_rename (reflexarc_common.h), never per event.
 *
 *   sched:sched_migrate_task  watched tid: migrations[tgid].all += 1, and
 *                             when cpu_node[orig] != cpu_node[dest]: .cross
 *                             += 1 and one struct numa_event into the ring
 *                             buffer numa_events (events_lost[0] += 1 when it
 *                             is full)
 *   sched:sched_wakeup(_new)  watched tid: queued_at[tid] = now (_new first
 *                             clears exiting[tid])
 *   sched:sched_process_exit  tasks[tid] and queued_at[tid] deleted; a
 *                             selected thread's exiting[tid] = tgid
 *   sched:sched_switch        prev selected and ran_at set: oncpu[tgid,
 *                             cpu_node[this CPU]] += now - ran_at, then
 *                             ran_at = 0;
 *                             prev selected and still runnable (preempted):
 *                             queued_at[prev] = now; neither, nor watching
 *                             it, when exiting[prev] holds its tgid;
 *                             next watched: tasks[next].ran_at = now (in the
 *                             entry the watched test looked up), and when
 *                             queued: runq_hist[tgid, slot(now -
 *                             queued_at[next], us)] += 1
 * The loader reads and deletes migrations, runq_hist and oncpu once per
 * interval, and polls numa_events without blocking; events_lost is a running
 * count. On-CPU time is credited when a thread leaves the CPU, so a stretch
 * counts in the interval it ends in; ran_at = 0 means the thread was not
 * watched when it came on (or the stretch is already credited), and that
 * stretch is not counted.
 * cpu_node is written by the loader from reflexarc.core.topology (map
 * update, no recompile); -1 marks an unknown CPU, never counted as a crossing
 * nor in oncpu.
 *
 * Histogram slots are log-linear (hist_slot in reflexarc_common.h), HIST_SLOTS
 * in all.
 *
 * The task name in an event is the tracepoint's comm field: a __data_loc
 * string on newer kernels (COMM_DATA_LOC defined), a char[16] before.
 *
 * cflags: -DMAX_SELECTED -DMAX_PIDS -DMAX_THREADS -DMAX_EXITING -DMAX_CPUS
 *         -DHIST_SLOTS -DRING_PAGES (a power of two) [-DCOMM_DATA_LOC]
 */
#include <uapi/linux/ptrace.h>

#define WITH_SELECTION
#include "reflexarc_common.h"

/* sched_switch reports a preempted task as TASK_REPORT_MAX (0x100 since 4.14,
 * above every sleeping state bit) and a task that yielded as 0. */
#define SLEEP_STATE_BITS 0xff

struct mig { u64 all; u64 cross; };

/* tasks value: the thread's process, and when it last came on a CPU while
 * watched (bpf_ktime_get_ns; 0: unknown or already credited). The loader
 * uses the types bcc derives from these two structs. */
struct task { u32 tgid; u64 ran_at; };

/* oncpu key: a process and the node of the CPUs it ran on. */
struct node_key { u32 tgid; s32 node; };

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

BPF_TABLE("lru_hash", u32, struct task, tasks, MAX_THREADS);
BPF_TABLE("lru_hash", u32, u32, exiting, MAX_EXITING);   /* tid -> tgid: past sched_process_exit */
BPF_TABLE("lru_hash", u32, u64, queued_at, MAX_THREADS);
BPF_ARRAY(cpu_node, s32, MAX_CPUS);
BPF_HASH(migrations, u32, struct mig, MAX_PIDS);
BPF_HASH(runq_hist, struct hist_key, u64, MAX_PIDS * 32);
BPF_HASH(oncpu, struct node_key, u64, MAX_PIDS * 8);   /* ns; room for 8 nodes per pid on average */
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
    struct task *known = tasks.lookup(&tid);
    if (!known)
        return 0;
    u32 tgid = known->tgid;
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

static __always_inline int wakeup(u32 tid)
{
    if (!tasks.lookup(&tid))
        return 0;
    u64 now = bpf_ktime_get_ns();
    queued_at.update(&tid, &now);
    return 0;
}

int on_wakeup(struct tracepoint__sched__sched_wakeup *args)
{
    return wakeup(args->pid);
}

/* A new task: its tid may be one an exited thread had. */
int on_wakeup_new(struct tracepoint__sched__sched_wakeup_new *args)
{
    u32 tid = args->pid;
    if (exiting.lookup(&tid))
        exiting.delete(&tid);
    return wakeup(tid);
}

/* Add the stretch a watched thread leaving this CPU ran since ran_at to its
 * process's time on this CPU's node. */
static __always_inline void credit_oncpu(struct task *t, u64 now)
{
    struct node_key nk = {.tgid = t->tgid, .node = node_of(bpf_get_smp_processor_id())};
    u64 ran = now - t->ran_at;
    t->ran_at = 0;
    if (nk.node < 0)
        return;
    u64 zero = 0;
    u64 *ns = oncpu.lookup_or_try_init(&nk, &zero);
    if (ns)
        __sync_fetch_and_add(ns, ran);
}

int on_switch(struct tracepoint__sched__sched_switch *args)
{
    u32 prev = args->prev_pid, next = args->next_pid;
    u64 now = 0;                          /* read once per switch, and only when needed */

    if (prev != 0) {                      /* current is prev here */
        u32 tgid = bpf_get_current_pid_tgid() >> 32;
        int leaving = 0;
        if (selected(tgid)) {
            struct task *known = tasks.lookup(&prev);
            if (known && known->tgid == tgid) {
                if (known->ran_at) {
                    now = bpf_ktime_get_ns();
                    credit_oncpu(known, now);
                }
            } else {
                u32 *gone = exiting.lookup(&prev);
                leaving = gone && *gone == tgid;   /* on its way out: not watched again */
                if (!leaving) {
                    struct task fresh = {.tgid = tgid};
                    tasks.update(&prev, &fresh);
                }
            }
            if (!leaving && (args->prev_state & SLEEP_STATE_BITS) == 0) {
                if (!now)
                    now = bpf_ktime_get_ns();
                queued_at.update(&prev, &now);
            }
        } else if (tasks.lookup(&prev)) {
            tasks.delete(&prev);          /* no longer selected */
        }
    }

    if (next != 0) {
        struct task *t = tasks.lookup(&next);
        if (!t)
            return 0;
        if (!now)
            now = bpf_ktime_get_ns();
        t->ran_at = now;
        u64 *queued = queued_at.lookup(&next);
        if (!queued)
            return 0;
        struct hist_key hk = {.id = t->tgid, .slot = hist_slot((now - *queued) / 1000)};
        queued_at.delete(&next);
        runq_hist.atomic_increment(hk);
    }
    return 0;
}

int on_exit(void *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tid = id, tgid = id >> 32;
    tasks.delete(&tid);
    queued_at.delete(&tid);
    if (selected(tgid))
        exiting.update(&tid, &tgid);
    return 0;
}
