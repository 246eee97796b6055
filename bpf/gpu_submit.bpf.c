/* gpu_submit.bpf.c: NVIDIA driver submissions of selected processes.
 * Loader: bpf/gpu_submit.py (class GpuSubmit).
 *
 * On syscalls:sys_enter_ioctl whose ioctl type ((cmd >> 8) & 0xff) is IOCTL_TYPE
 * ('F', 0x46, the NVIDIA driver's), for selected processes only:
 *   submits[tgid]        += 1
 *   gap_hist[tgid, slot] += 1   gap since the process's previous submission (us)
 * The loader reads and deletes both maps once per interval. last_submit keeps
 * each process's last timestamp across intervals (LRU, so exited pids age out).
 *
 * Selection (map updates, no recompile): sel_mode[0] == 0 watches every process;
 * otherwise a task is selected when its tgid is in sel_pid, its thread name in
 * sel_comm or its cgroup id in sel_cgroup.
 *
 * Histogram slots are log-linear: values below 4 have their own slot, above that
 * four sub-slots per power of two (<= 25 % wide), HIST_SLOTS in all.
 *
 * cflags: -DIOCTL_TYPE -DMAX_PIDS -DMAX_SELECTED -DHIST_SLOTS
 */
#include <uapi/linux/ptrace.h>

struct comm_key { char comm[16]; };
struct hist_key { u32 id; u32 slot; };

BPF_ARRAY(sel_mode, u32, 1);
BPF_HASH(sel_pid, u32, u8, MAX_SELECTED);
BPF_HASH(sel_comm, struct comm_key, u8, MAX_SELECTED);
BPF_HASH(sel_cgroup, u64, u8, MAX_SELECTED);

BPF_HASH(submits, u32, u64, MAX_PIDS);
BPF_TABLE("lru_hash", u32, u64, last_submit, MAX_PIDS);
BPF_HASH(gap_hist, struct hist_key, u64, MAX_PIDS * 64);

static __always_inline u32 hist_slot(u64 v)
{
    if (v < 4)
        return v;
    u32 e = bpf_log2l(v) - 1;             /* bcc's bpf_log2l is floor(log2 v) + 1 */
    u32 slot = 4 * (e - 1) + ((v >> (e - 2)) & 3);
    return slot < HIST_SLOTS ? slot : HIST_SLOTS - 1;
}

static __always_inline int selected(u32 tgid)
{
    u32 zero = 0;
    u32 *mode = sel_mode.lookup(&zero);
    if (!mode || *mode == 0)
        return 1;
    if (sel_pid.lookup(&tgid))
        return 1;
    struct comm_key ck = {};
    bpf_get_current_comm(&ck.comm, sizeof(ck.comm));
    if (sel_comm.lookup(&ck))
        return 1;
    u64 cg = bpf_get_current_cgroup_id();
    return sel_cgroup.lookup(&cg) != 0;
}

TRACEPOINT_PROBE(syscalls, sys_enter_ioctl)
{
    u32 cmd = args->cmd;
    if (((cmd >> 8) & 0xff) != IOCTL_TYPE)
        return 0;
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (!selected(tgid))
        return 0;

    u64 now = bpf_ktime_get_ns();
    submits.atomic_increment(tgid);

    u64 *last = last_submit.lookup(&tgid);
    if (last && now > *last) {
        struct hist_key hk = {.id = tgid, .slot = hist_slot((now - *last) / 1000)};
        gap_hist.atomic_increment(hk);
    }
    last_submit.update(&tgid, &now);
    return 0;
}
