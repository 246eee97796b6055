/* link_traffic.bpf.c: egress bytes and packets per interface, split by the job
 * whose socket sent them.
 * Loader: bpf/link_traffic.py (class LinkTraffic), which attaches this one
 * SCHED_CLS program to the egress hook of every watched interface: as a tcx
 * BPF link (kernel >= 6.6), else as a clsact cls_bpf filter in direct-action
 * mode.
 *
 *   egress skb -> counts[netns cookie, ifindex, job slot] += {len, segments}
 *
 * The job slot is the value sel_cgroup holds for the sending socket's cgroup v2
 * id (bpf_skb_cgroup_id), else for the first of its ancestors at levels
 * 0..MAX_LEVEL (bpf_skb_ancestor_cgroup_id) that is a key; 0 (SLOT_NONE) when
 * none is, and for packets without a local socket (forwarded, kernel replies).
 * The loader gives each job a slot 1..N (every cgroup id of one job maps to the
 * same slot; a policy's explicit cgroup is one job) and keeps it stable while
 * the job lives. A selection change is a map update: the loader writes
 * sel_cgroup and sel_count (the number of keys, 0 skips the walk).
 *
 * counts is per CPU and never reset: the loader sums the CPUs' running totals
 * once per interval, and a slot handed to a new job starts from a baseline the
 * loader reads then, so it inherits nothing. len is skb->len, the bytes handed
 * to the device with their link-layer header (what the device's own tx_bytes
 * counts); a GSO skb counts once in bytes and gso_segs times in packets.
 *
 * Only bpf_* calls and __sk_buff fields are read, never kernel structs, and the
 * packet is left as it is: the program returns TC_ACT_UNSPEC (TCX_NEXT), so the
 * programs and filters after it on the same hook (tcx links, then clsact
 * filters such as the DSCP marker) still run.
 *
 * cflags: -DMAX_LEVEL (deepest ancestor level tested), -DMAX_SELECTED (keys of
 *         sel_cgroup), -DMAX_KEYS (entries of counts: interfaces x (slots + 1)),
 *         -DWITH_NETNS_COOKIE (0 when tc programs cannot call
 *         bpf_get_netns_cookie: the cookie is then 0 and the ifindex alone
 *         tells apart the interfaces of the one namespace a probe watches)
 */
#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>

#define SLOT_NONE 0

struct count_key {
    u64 netns;          /* netns cookie of the device, 0 without WITH_NETNS_COOKIE */
    u32 ifindex;
    u32 traffic;        /* job slot: 1..N, or SLOT_NONE for no selected job's */
};

struct count_val {
    u64 bytes;
    u64 packets;
};

BPF_PERCPU_HASH(counts, struct count_key, struct count_val, MAX_KEYS);
BPF_HASH(sel_cgroup, u64, u32, MAX_SELECTED);      /* cgroup v2 id -> job slot */
BPF_ARRAY(sel_count, u32, 1);

static __always_inline u32 traffic_of(struct __sk_buff *skb)
{
    u32 zero = 0;
    u32 *n = sel_count.lookup(&zero);
    if (!n || *n == 0)
        return SLOT_NONE;
    u64 id = bpf_skb_cgroup_id(skb);
    if (id == 0)                                  /* no full socket */
        return SLOT_NONE;
    u32 *slot = sel_cgroup.lookup(&id);
    if (slot)
        return *slot;
    for (int level = 0; level <= MAX_LEVEL; level++) {
        u64 up = bpf_skb_ancestor_cgroup_id(skb, level);
        if (up == 0 || up == id)                  /* above the socket's own level */
            break;
        slot = sel_cgroup.lookup(&up);
        if (slot)
            return *slot;
    }
    return SLOT_NONE;
}

int link_traffic(struct __sk_buff *skb)
{
    struct count_key key = {};
#if WITH_NETNS_COOKIE
    key.netns = bpf_get_netns_cookie(skb);
#endif
    key.ifindex = skb->ifindex;
    key.traffic = traffic_of(skb);
    struct count_val zero = {};
    struct count_val *v = counts.lookup_or_try_init(&key, &zero);
    if (v) {
        u32 segs = skb->gso_segs;
        v->bytes += skb->len;
        v->packets += segs ? segs : 1;
    }
    return TC_ACT_UNSPEC;
}
