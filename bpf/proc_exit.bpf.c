/* proc_exit.bpf.c: the processes that exited on the node.
 * Loader: bpf/proc_exit.py (class ProcExit).
 *
 * sched:sched_process_exit runs in every exiting thread, before its last
 * switch out: by then the process has made every read and run every stretch
 * the other probes count. One thread stands for its process:
 *   GROUP_DEAD defined (the tracepoint has group_dead): the last thread of the
 *       process to exit (group_dead true);
 *   otherwise: the main thread (tid == tgid), which exit_group takes down with
 *       the others (a main thread that ends alone, pthread_exit, passes for
 *       its process's exit).
 * Its tgid goes as one struct proc_exit into the ring buffer exits, waking no
 * one (BPF_RB_NO_WAKEUP): the loader reads it once per interval without
 * waiting; when the buffer is full the exit is lost and exits_lost[0] += 1 (a
 * running count).
 *
 * No selection: every process on the node is reported (exits are rare next to
 * syscalls and context switches); the signal bus looks each one up among the
 * processes it holds series of.
 *
 * cflags: -DRING_PAGES (a power of two) [-DGROUP_DEAD]
 */
#include <uapi/linux/ptrace.h>

/* Mirrored by the loader as a c_uint32. */
struct proc_exit { u32 tgid; };

BPF_RINGBUF_OUTPUT(exits, RING_PAGES);
BPF_PERCPU_ARRAY(exits_lost, u64, 1);

int on_exit(struct tracepoint__sched__sched_process_exit *args)
{
    u64 id = bpf_get_current_pid_tgid();
#ifdef GROUP_DEAD
    if (!args->group_dead)
        return 0;
#else
    if ((u32)id != (u32)(id >> 32))
        return 0;
#endif
    struct proc_exit *e = exits.ringbuf_reserve(sizeof(struct proc_exit));
    if (!e) {
        u32 zero = 0;
        u64 *lost = exits_lost.lookup(&zero);
        if (lost)
            *lost += 1;                   /* per-CPU slot: no other writer */
        return 0;
    }
    e->tgid = id >> 32;
    exits.ringbuf_submit(e, BPF_RB_NO_WAKEUP);
    return 0;
}
