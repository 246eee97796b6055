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
 * otherwise a task is selected when its tgid is in sel_pid (the node's training
 * processes and explicitly named pids) or its cgroup id in sel_cgroup; thread
 * names are not used (they name DataLoader workers, which do not submit). The
 * maps and selected() are in reflexarc_common.h.
 *
 * Histogram slots are log-linear (hist_slot in reflexarc_common.h), HIST_SLOTS
 * in all.
 *
 * cflags: -DIOCTL_TYPE -DMAX_PIDS -DMAX_SELECTED -DHIST_SLOTS
 */
#include <uapi/linux/ptrace.h>

#define WITH_SELECTION
#include "reflexarc_common.h"

BPF_HASH(submits, u32, u64, MAX_PIDS);
BPF_TABLE("lru_hash", u32, u64, last_submit, MAX_PIDS);
BPF_HASH(gap_hist, struct hist_key, u64, MAX_PIDS * 64);

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
