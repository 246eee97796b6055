/* link_traffic.bpf.c: egress bytes and packets per interface, split into the
 * job's traffic and everything else.
 * Loader: bpf/link_traffic.py (class LinkTraffic), which attaches this one
 * SCHED_CLS program to the egress hook of every watched interface: as a tcx
 * BPF link (kernel >= 6.6), else as a clsact cls_bpf filter in direct-action
 * mode.
 *
 *   egress skb -> counts[netns cookie, ifindex, traffic] += {len, segments}
 *
 * traffic is TRAFFIC_JOB when the sending socket's cgroup v2 id
 * (bpf_skb_cgroup_id), or the id of one of its ancestors at levels
 * 0..MAX_LEVEL (bpf_skb_ancestor_cgroup_id), is a key of sel_cgroup, and
 * TRAFFIC_OTHER otherwise, including packets without a local socket
 * (forwarded, kernel replies). A selection change is a map update: the loader
 * writes sel_cgroup and sel_count (the number of keys, 0 skips the walk).
 *
 * counts is per CPU and never reset: the loader sums the CPUs' running totals
 * once per interval. len is skb->len, the bytes handed to the device with their
 * link-layer header (what the device's own tx_bytes counts); a GSO skb counts
 * once in bytes and gso_segs times in packets.
 *
 * Only bpf_* calls and __sk_buff fields are read, never kernel structs, and the
 * packet is left as it is: the program returns TC_ACT_UNSPEC (TCX_NEXT), so the
 * programs and filters after it on the same hook (tcx links, then clsact
 * filters such as the DSCP marker) still run.
 *
 * cflags: -DMAX_LEVEL (deepest ancestor level tested), -DMAX_SELECTED (keys of
 *         sel_cgroup), -DMAX_KEYS (entries of counts), -DWITH_NETNS_COOKIE (0
 *         when tc programs cannot call bpf_get_netns_cookie: the cookie is then
 *         0 and the ifindex alone tells apart the interfaces of the one
 *         namespace a probe watches)
 */
#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>

#define TRAFFIC_OTHER 0
#define TRAFFIC_JOB 1

struct count_key {
    u64 netns;          /* netns cookie of the device, 0 without WITH_NETNS_COOKIE */
    u32 ifindex;
    u32 traffic;        /* TRAFFIC_OTHER or TRAFFIC_JOB */
};

struct count_val {
    u64 bytes;
    u64 packets;
};

BPF_PERCPU_HASH(counts, struct count_key, struct count_val, MAX_KEYS);
BPF_HASH(sel_cgroup, u64, u8, MAX_SELECTED);
BPF_ARRAY(sel_count, u32, 1);

static __always_inline u32 traffic_of(struct __sk_buff *skb)
{
    u32 zero = 0;
    u32 *n = sel_count.lookup(&zero);
    if (!n || *n == 0)
        return TRAFFIC_OTHER;
    u64 id = bpf_skb_cgroup_id(skb);
    if (id == 0)                                  /* no full socket */
        return TRAFFIC_OTHER;
    if (sel_cgroup.lookup(&id))
        return TRAFFIC_JOB;
    for (int level = 0; level <= MAX_LEVEL; level++) {
        u64 up = bpf_skb_ancestor_cgroup_id(skb, level);
        if (up == 0 || up == id)                  /* above the socket's own level */
            break;
        if (sel_cgroup.lookup(&up))
            return TRAFFIC_JOB;
    }
    return TRAFFIC_OTHER;
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
