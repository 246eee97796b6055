/* batch_wait.bpf.c: how long each training process waits for its next batch
 * from its DataLoader workers, and how often it takes one.
 * Loader: bpf/batch_wait.py (class BatchWait).
 *
 * PyTorch's DataLoader hands batches from its worker processes to the
 * training process through one multiprocessing.Queue, a pipe: the training
 * process calls Queue.get(timeout=5), which polls the pipe's read end
 * (Connection.poll -> selectors.PollSelector -> poll(2); glibc issues the poll
 * syscall on x86_64, ppoll where the ABI has no poll) and then reads the
 * message with read(2): a 4-byte length header, then the pickled batch. The
 * loader finds those read ends in /proc and writes {tgid, fd} into watch_fd
 * and the tgid, with its number of workers, into trainers; no kernel structure
 * is read.
 *
 *   sys_enter_poll / sys_enter_ppoll: when the current process is a watched
 *       trainer (one hash lookup: every poll on the node pays it), the pollfd
 *       array (struct pollfd: user ABI, read with bpf_probe_read_user; the
 *       first MAX_POLLFDS entries) is searched for a watched fd; the first poll
 *       of a wait stores wait_start[thread] = {now, fd}. Further polls of the
 *       same fd (Queue.get's 5 s timeouts, retried by the DataLoader) keep it.
 *       A poll of one fd that is not watched stores it too: it may be a new
 *       epoch's data queue the loader has not found yet (see pending). A new
 *       wait on a watched fd may end the step (see steps, below).
 *   sys_enter_read with count == 4 by a watched trainer, of the fd this
 *       thread last polled: a message header it waited for (reads of any
 *       other size return at once, before any lookup, and other processes'
 *       after one; a split header is finished by a read of 1-3 bytes, so each
 *       message counts once). Queue.get(timeout) always polls first, even
 *       when a batch is there already; a header read without that poll is not
 *       a batch (the resource sharer's sockets, which pass tensors' fds, read
 *       headers too, on fd numbers a later data queue may reuse). Its wait is
 *       now - wait_start of this thread. On a watched fd it is a batch:
 *       stats[tgid] adds it and its wait, wait_hist[tgid, slot(wait in
 *       microseconds)] += 1, and the steps (below) move on. On an fd not
 *       watched yet it is added to pending[{tgid, fd}] instead: a new epoch's
 *       data queue, with new fd numbers, is taken before the loader has found
 *       it in /proc; the loader adds pending to the trainer's stats for the
 *       fds it then finds to be its data queue and drops the rest (the
 *       trainer's other pipes and sockets).
 *   steps: a step ends where the loop asks for its next batch (the first poll
 *       of a wait), as the job's own step time does. The DataLoader hands
 *       batches over in order: when its workers finish out of order, the
 *       training process reads several messages in one next(), keeping the
 *       early ones, and then takes them in the next steps without a syscall.
 *       So batches form groups, kept in a chain {anchor: the wait start of the
 *       group's first batch, last: its last read, batches, gap: the low
 *       envelope of the time from a read to the next step's first poll, the
 *       step's own work}. A batch whose wait began less than gap / BURST_DIV
 *       after the last read (the same next(), not a step later), while the
 *       group holds fewer batches than the trainer has workers
 *       (trainers[tgid]: no more can be early), joins the group. The envelope
 *       follows a shorter gap at once and a longer one by 1/8 of the
 *       difference, so steps that alternate a long wait and none (a rank that
 *       waits for its batches every other step, or for its peer in the
 *       all-reduce) keep a step's work as the reference, not the longest
 *       step; no group joins before the first gap is seen. Any other wait
 *       closes it: the time from its anchor to this wait's start, divided
 *       among its batches,
 *       is the step time of the steps that took them (stats adds the batches
 *       as intervals and the time as interval_ns), and a new group starts.
 *       A wait that cannot join (by the same test, made at its first poll of
 *       a watched fd) closes the group right there, where the step ended,
 *       rather than when its batch arrives, a starved loop's wait later. The
 *       chain is fd_chain[{tgid, fd}], or trainer_chain[tgid] (the chain on
 *       the trainer's watched fds) where this fd has none or an older one: a
 *       new epoch's queue continues the old one's chain, and a stale chain of
 *       an fd number reused is never followed. A batch on an fd not watched
 *       moves only fd_chain (a read of another pipe or socket must not move
 *       the trainer's chain); its group's time goes to pending.
 *   task:task_rename: a task naming itself (prctl) as one of worker_comms
 *       (pt_data_worker: torch names its workers so) is put in renamed, by
 *       thread id: the loader drains it each interval and looks for the new
 *       workers' data queue then, so a new epoch's workers (new pids, a new
 *       pipe) are followed without scanning /proc every interval.
 *
 * The time stamps are bpf_ktime_get_ns (CLOCK_MONOTONIC, as Python's
 * time.monotonic). The loader reads and deletes stats and wait_hist once per
 * interval, and pending with them; fd_chain, trainer_chain and wait_start
 * stay (fd_chain, wait_start and renamed are LRU: threads that exit mid-wait
 * and fds that were never a data queue leave entries behind).
 *
 * Histogram slots are log-linear (hist_slot in reflexarc_common.h), HIST_SLOTS
 * in all.
 *
 * cflags: -DMAX_TRAINERS -DMAX_WATCHED -DMAX_THREADS -DMAX_POLLFDS -DHIST_SLOTS -DBURST_DIV
 *         [-DPOLL_SYSCALL] [-DPPOLL_SYSCALL] [-DRENAME_TRACEPOINT [-DRENAME_HAS_PID]]
 */
#include <uapi/linux/ptrace.h>
#include <linux/signal.h>          /* sigset_t, in the generated args of sys_enter_ppoll */

#include "reflexarc_common.h"

struct watch_key { u32 tgid; u32 fd; };
struct wait_mark { u64 ts; u32 fd; u32 pad; };
/* intervals: batches of the groups closed (the steps they served); interval_ns: those groups' time */
struct batch_stats { u64 batches; u64 wait_ns; u64 intervals; u64 interval_ns; };
struct chain { u64 anchor; u64 last; u64 gap; u64 batches; };
struct user_pollfd { s32 fd; s16 events; s16 revents; };   /* struct pollfd, <poll.h> */
struct worker_comm { char comm[16]; };

BPF_HASH(trainers, u32, u8, MAX_TRAINERS);          /* value: its workers, the most a burst holds */
BPF_HASH(watch_fd, struct watch_key, u8, MAX_WATCHED);
BPF_TABLE("lru_hash", struct watch_key, struct chain, fd_chain, MAX_WATCHED);
BPF_HASH(trainer_chain, u32, struct chain, MAX_TRAINERS);
BPF_TABLE("lru_hash", struct watch_key, struct batch_stats, pending, MAX_WATCHED);
BPF_TABLE("lru_hash", u64, struct wait_mark, wait_start, MAX_THREADS);
BPF_HASH(stats, u32, struct batch_stats, MAX_TRAINERS);
BPF_HASH(wait_hist, struct hist_key, u64, MAX_TRAINERS * 32);

/* The chain a batch on fd k continues: the fd's own, unless the trainer has
 * moved on since on another fd (or the fd has none); 0 where neither exists. */
static __always_inline int pick_chain(struct watch_key *k, struct chain *c)
{
    struct chain *own = fd_chain.lookup(k);
    struct chain *trainer = trainer_chain.lookup(&k->tgid);
    if (own && (!trainer || own->last >= trainer->last))
        *c = *own;
    else if (trainer)
        *c = *trainer;
    else
        return 0;
    return 1;
}

/* A wait that began gap_ns after the chain's last read: part of its burst
 * (the same next()) while the group has room. */
static __always_inline int in_burst(struct chain *c, u64 gap_ns, u8 cap)
{
    return gap_ns * BURST_DIV < c->gap && c->batches < cap;
}

/* A step ended gap_ns after the chain's last read: the envelope of a step's
 * own work follows a shorter one at once, a longer one by 1/8. */
static __always_inline void learn_gap(struct chain *c, u64 gap_ns)
{
    if (!c->gap || gap_ns < c->gap)
        c->gap = gap_ns;
    else
        c->gap += (gap_ns - c->gap) >> 3;
}

#if defined(POLL_SYSCALL) || defined(PPOLL_SYSCALL)
/* A wait for the watched fd k begins at now. Where it cannot be part of the
 * chain's burst (in_burst), the batch waited for will be read later still:
 * the step ended here, so the group closes now rather than when the batch
 * arrives (a starved loop's step is counted where it ended, not a wait
 * later). Its read then opens the new group, anchored here. */
static __always_inline void close_at_wait(struct watch_key *k, u64 now, u8 cap)
{
    struct chain c = {};
    if (!pick_chain(k, &c) || !c.batches || !c.last || now <= c.last || now <= c.anchor)
        return;
    if (in_burst(&c, now - c.last, cap))
        return;                       /* maybe a burst: the read decides */
    u64 span = now - c.anchor;
    struct batch_stats zero = {};
    struct batch_stats *s = stats.lookup_or_try_init(&k->tgid, &zero);
    if (!s)
        return;
    __sync_fetch_and_add(&s->intervals, c.batches);
    __sync_fetch_and_add(&s->interval_ns, span);
    learn_gap(&c, now - c.last);
    c.anchor = now;
    c.batches = 0;                    /* the batch waited for joins at its read */
    trainer_chain.update(&k->tgid, &c);
    fd_chain.update(k, &c);
}

static __always_inline int mark_wait(u64 id, struct watch_key *k, int watched, u8 cap)
{
    struct wait_mark *w = wait_start.lookup(&id);
    if (w && w->fd == k->fd)
        return 0;                     /* still waiting for the same message */
    struct wait_mark m = {.ts = bpf_ktime_get_ns(), .fd = k->fd};
    wait_start.update(&id, &m);
    if (watched)
        close_at_wait(k, m.ts, cap);
    return 0;
}

static __always_inline int poll_enter(const struct user_pollfd *ufds, u64 nfds)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    u8 *cap = trainers.lookup(&tgid);
    if (!cap)
        return 0;
    u8 workers = *cap;
    struct watch_key k = {.tgid = tgid};
    s32 only = -1;                    /* the fd of a one-fd poll: maybe a data queue not found yet */
#pragma unroll
    for (int i = 0; i < MAX_POLLFDS; i++) {
        if (i >= nfds)
            break;
        struct user_pollfd p = {};
        if (bpf_probe_read_user(&p, sizeof(p), &ufds[i]) != 0)
            return 0;
        if (p.fd < 0)
            continue;
        if (nfds == 1)
            only = p.fd;
        k.fd = p.fd;
        if (watch_fd.lookup(&k))
            return mark_wait(id, &k, 1, workers);
    }
    if (only >= 0) {
        k.fd = (u32)only;
        return mark_wait(id, &k, 0, workers);
    }
    return 0;
}
#endif

#ifdef POLL_SYSCALL
int on_poll_enter(struct tracepoint__syscalls__sys_enter_poll *args)
{
    return poll_enter((const struct user_pollfd *)args->ufds, args->nfds);
}
#endif

#ifdef PPOLL_SYSCALL
int on_ppoll_enter(struct tracepoint__syscalls__sys_enter_ppoll *args)
{
    return poll_enter((const struct user_pollfd *)args->ufds, args->nfds);
}
#endif

static __always_inline void add_batch(struct batch_stats *s, u64 wait, u64 served, u64 span)
{
    __sync_fetch_and_add(&s->batches, 1);
    __sync_fetch_and_add(&s->wait_ns, wait);
    if (served) {
        __sync_fetch_and_add(&s->intervals, served);
        __sync_fetch_and_add(&s->interval_ns, span);
    }
}

/* Move chain c to a batch read at now, whose wait began at start: join the
 * burst, or close the group (*served batches over *span ns, from its first
 * batch's wait start to this one's) and start a new one. */
static __always_inline void advance(struct chain *c, u64 now, u64 start, u8 cap, u64 *served, u64 *span)
{
    *served = 0;
    *span = 0;
    if (!c->batches && c->anchor == start) {
        c->batches = 1;               /* the group closed when this wait began */
    } else if (c->last && start >= c->last && in_burst(c, start - c->last, cap)) {
        c->batches += 1;
    } else {
        if (c->last && start > c->anchor && c->batches) {
            *served = c->batches;
            *span = start - c->anchor;
            if (start >= c->last)
                learn_gap(c, start - c->last);
        }
        c->anchor = start;
        c->batches = 1;
    }
    c->last = now;
}

int on_read_enter(struct tracepoint__syscalls__sys_enter_read *args)
{
    if (args->count != 4)
        return 0;                     /* not a message header */
    u64 id = bpf_get_current_pid_tgid();
    struct watch_key k = {.tgid = id >> 32, .fd = (u32)args->fd};
    u8 *cap = trainers.lookup(&k.tgid);
    if (!cap)
        return 0;
    u8 workers = *cap;
    struct wait_mark *w = wait_start.lookup(&id);
    if (!w || w->fd != k.fd)
        return 0;                     /* not waited for with a poll of this fd: not a batch */
    u64 now = bpf_ktime_get_ns();
    u64 start = w->ts;
    u64 wait = now > start ? now - start : 0;
    wait_start.delete(&id);
    struct chain c = {};
    pick_chain(&k, &c);
    u64 served, span;
    advance(&c, now, start, workers, &served, &span);
    struct batch_stats zero = {};
    if (watch_fd.lookup(&k)) {
        struct batch_stats *s = stats.lookup_or_try_init(&k.tgid, &zero);
        if (!s)
            return 0;
        add_batch(s, wait, served, span);
        struct hist_key hk = {.id = k.tgid, .slot = hist_slot(wait / 1000)};
        wait_hist.atomic_increment(hk);
        trainer_chain.update(&k.tgid, &c);
    } else {
        struct batch_stats *s = pending.lookup_or_try_init(&k, &zero);
        if (!s)
            return 0;
        add_batch(s, wait, served, span);
    }
    fd_chain.update(&k, &c);
    return 0;
}

#ifdef RENAME_TRACEPOINT
BPF_HASH(worker_comms, struct worker_comm, u8, 8);
BPF_TABLE("lru_hash", u32, u8, renamed, MAX_TRAINERS * 16);

int on_rename(struct tracepoint__task__task_rename *args)
{
    struct worker_comm c = {};
    bpf_probe_read_kernel_str(&c.comm, sizeof(c.comm), args->newcomm);
    if (!worker_comms.lookup(&c))
        return 0;
#ifdef RENAME_HAS_PID
    u32 tid = args->pid;              /* the renamed task (a write to /proc/<pid>/comm renames another) */
#else
    u32 tid = (u32)bpf_get_current_pid_tgid();   /* kernels whose task_rename has no pid: prctl renames itself */
#endif
    u8 one = 1;
    renamed.update(&tid, &one);
    return 0;
}
#endif
