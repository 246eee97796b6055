/* reflexarc_common.h: the C the probe programs share.
 * Included by dataloader_io.bpf.c, sched_numa.bpf.c, gpu_submit.bpf.c, batch_wait.bpf.c,
 * block_io.bpf.c, net_tcp.bpf.c and rdma_qp.bpf.c (loaders bpf/dataloader_io.py,
 * bpf/sched_numa.py, bpf/gpu_submit.py, bpf/batch_wait.py, bpf/block_io.py, bpf/net_tcp.py,
 * bpf/rdma_qp.py). Probe.final_source() (bpf/probe.py) replaces the
 * #include "reflexarc_common.h" line with this text before bcc compiles the
 * program, and Probe.dump_bpf() prints that result: bcc rewrites map calls and
 * tracepoint arguments only in the file it compiles, never in a header found
 * through -I.
 *
 * Always:
 *   struct hist_key {id, slot}   key of a per-id histogram (pid, device)
 *   hist_slot(v)                 log-linear slot of v: values below 4 have their
 *                                own slot, above that four sub-slots per power
 *                                of two (<= 25 % wide), HIST_SLOTS in all (the
 *                                Python mirror is bpf/loghist.py)
 *
 * With WITH_SELECTION defined before the include (dataloader_io, sched_numa,
 * gpu_submit), the task selection (convention and Python side in bpf/maps.py):
 *   sel_mode[0]                  0: every task; else SEL_FILTER | SEL_CGROUPS
 *   sel_pid, sel_comm, sel_cgroup  selected tgids, names, cgroup v2 ids
 *   selected(tgid)               whether the current task is selected: its tgid
 *                                in sel_pid, or, with SEL_CGROUPS set, its
 *                                cgroup id in sel_cgroup
 *   on_rename                    task:task_rename program that adds the tgid of
 *                                a main thread naming itself as a selected comm
 * Names are resolved to tgids by the loader's /proc scan and by on_rename,
 * never per event.
 *
 * cflags: -DHIST_SLOTS, and with WITH_SELECTION -DMAX_SELECTED
 */
#ifndef REFLEXARC_COMMON_H
#define REFLEXARC_COMMON_H

#ifndef HIST_SLOTS
#error "HIST_SLOTS must come from the loader's cflags (-DHIST_SLOTS=...)"
#endif

struct hist_key { u32 id; u32 slot; };

static __always_inline u32 hist_slot(u64 v)
{
    if (v < 4)
        return v;
    u32 e = bpf_log2l(v) - 1;             /* bcc's bpf_log2l is floor(log2 v) + 1 */
    u32 slot = 4 * (e - 1) + ((v >> (e - 2)) & 3);
    return slot < HIST_SLOTS ? slot : HIST_SLOTS - 1;
}

#ifdef WITH_SELECTION
#ifndef MAX_SELECTED
#error "MAX_SELECTED must come from the loader's cflags (-DMAX_SELECTED=...)"
#endif

#define SEL_FILTER 1
#define SEL_CGROUPS 2

struct comm_key { char comm[16]; };

BPF_ARRAY(sel_mode, u32, 1);
BPF_HASH(sel_pid, u32, u8, MAX_SELECTED);
BPF_HASH(sel_comm, struct comm_key, u8, MAX_SELECTED);
BPF_HASH(sel_cgroup, u64, u8, MAX_SELECTED);

static __always_inline int selected(u32 tgid)
{
    u32 zero = 0;
    u32 *mode = sel_mode.lookup(&zero);
    if (!mode || !(*mode & SEL_FILTER))
        return 1;
    if (sel_pid.lookup(&tgid))
        return 1;
    if (!(*mode & SEL_CGROUPS))
        return 0;                          /* sel_cgroup is empty */
    u64 cg = bpf_get_current_cgroup_id();
    return sel_cgroup.lookup(&cg) != 0;
}

/* task:task_rename, in the renamed task for prctl(PR_SET_NAME) and exec: a
 * process whose main thread names itself as a selected comm joins sel_pid at
 * once. Other threads' names, and renames of another task (writes to
 * /proc/<pid>/comm), are left to the loader's scan of process names. */
int on_rename(struct tracepoint__task__task_rename *args)
{
    u64 id = bpf_get_current_pid_tgid();
    if (args->pid != (u32)id || (u32)id != (u32)(id >> 32))
        return 0;
    struct comm_key ck = {};
    bpf_probe_read_kernel_str(&ck.comm, sizeof(ck.comm), args->newcomm);
    if (!sel_comm.lookup(&ck))
        return 0;
    u32 tgid = id >> 32;
    u8 one = 1;
    sel_pid.update(&tgid, &one);
    return 0;
}
#endif /* WITH_SELECTION */

#endif /* REFLEXARC_COMMON_H */
