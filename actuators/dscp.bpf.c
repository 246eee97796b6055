/* tc-BPF egress classifier that rewrites the DSCP of matching flows.
 *
 * Loader: actuators/dscp.py (DscpActuator). It compiles this file once per
 * process through bcc, pins the program and the three maps under bpffs and
 * attaches the program to the clsact egress hook of each interface it marks.
 *
 * Which flows get which DSCP lives in the `rules` map, so retagging is a map
 * update, never a filter re-attach. A rule matches on: interface (netns cookie +
 * ifindex), IP family, L4 protocol, an L4 port range (source OR destination
 * port), an address prefix (source OR destination address) and the cgroup v2 id
 * of the sending socket (bpf_skb_cgroup_id; net_cls classids are not used).
 * Among matching rules the one with the highest `seq` (the newest) wins.
 *
 * The DSCP is written into the IPv4 TOS byte (header checksum fixed with
 * bpf_l3_csum_replace) or the IPv6 traffic class; the two ECN bits are kept.
 * A rule may also set skb->priority so an HTB qdisc can classify on it.
 * The program always returns TC_ACT_UNSPEC so filters after it still run.
 *
 * The structs of the maps and their flags are in dscp.h, shared with the
 * loader's ctypes mirror (offsets checked by tests/test_bpf_struct_layout.py).
 *
 * Parameters (cflags from the loader):
 *   -I            this directory, for dscp.h
 *   MAX_RULES     entries of the rules array
 *   RULE_SIZE     sizeof(struct rule) as the loader lays it out (checked below)
 *   PIN_RULES, PIN_IFACES, PIN_META   bpffs paths of the pinned maps
 *
 * Cost per packet: one hash lookup, one array lookup, two small header loads,
 * then a scan of the used rule slots (up to the high-water mark in `meta`).
 */
#include <uapi/linux/bpf.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/in.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/ipv6.h>
#include <uapi/linux/pkt_cls.h>

#include "dscp.h"

_Static_assert(sizeof(struct rule) == RULE_SIZE, "struct rule differs from the loader's layout");

BPF_TABLE_PINNED("array", u32, struct rule, rules, MAX_RULES, PIN_RULES);
BPF_TABLE_PINNED("hash", struct iface_key, struct iface, ifaces, 1024, PIN_IFACES);
BPF_TABLE_PINNED("array", u32, struct meta, meta, 1, PIN_META);

struct flow {
    u32 saddr[4];
    u32 daddr[4];
    u16 sport;
    u16 dport;
    u8 family;
    u8 l4proto;
    u8 has_ports;
};

static __always_inline int addr_match(const struct rule *r, const u32 *a)
{
    if (r->family == 4)
        return (a[0] & r->mask[0]) == r->addr[0];
    return (a[0] & r->mask[0]) == r->addr[0] && (a[1] & r->mask[1]) == r->addr[1] &&
           (a[2] & r->mask[2]) == r->addr[2] && (a[3] & r->mask[3]) == r->addr[3];
}

static __always_inline int rule_match(const struct rule *r, const struct flow *f,
                                      u64 netns, u32 ifindex, u64 cgroup_id)
{
    if (r->ifindex != ifindex || r->netns != netns)
        return 0;
    if (r->family && r->family != f->family)
        return 0;
    if (r->l4proto && r->l4proto != f->l4proto)
        return 0;
    if (r->cgroup_id && r->cgroup_id != cgroup_id)
        return 0;
    if (r->flags & RULE_MATCH_PORTS) {
        if (!f->has_ports)
            return 0;
        if (!((f->sport >= r->port_lo && f->sport <= r->port_hi) ||
              (f->dport >= r->port_lo && f->dport <= r->port_hi)))
            return 0;
    }
    if (r->flags & RULE_MATCH_ADDR) {
        if (!addr_match(r, f->saddr) && !addr_match(r, f->daddr))
            return 0;
    }
    return 1;
}

static __always_inline int load_ports(struct __sk_buff *skb, u32 off, struct flow *f)
{
    u16 ports[2];
    if (f->l4proto != IPPROTO_TCP && f->l4proto != IPPROTO_UDP)
        return 0;
    if (bpf_skb_load_bytes(skb, off, ports, sizeof(ports)) < 0)
        return 0;
    f->sport = bpf_ntohs(ports[0]);
    f->dport = bpf_ntohs(ports[1]);
    f->has_ports = 1;
    return 1;
}

int dscp_egress(struct __sk_buff *skb)
{
    struct iface_key ik = {};
    ik.netns = bpf_get_netns_cookie(skb);
    ik.ifindex = skb->ifindex;
    struct iface *ifc = ifaces.lookup(&ik);
    if (!ifc)
        return TC_ACT_UNSPEC;
    u32 zero = 0;
    struct meta *m = meta.lookup(&zero);
    if (!m || m->used == 0)
        return TC_ACT_UNSPEC;
    u32 l3 = ifc->l3_off;

    struct flow f = {};
    u8 old_ds = 0;                    /* the TOS / traffic class byte */
    if (skb->protocol == bpf_htons(ETH_P_IP)) {
        struct iphdr ip;
        if (bpf_skb_load_bytes(skb, l3, &ip, sizeof(ip)) < 0)
            return TC_ACT_UNSPEC;
        f.family = 4;
        f.l4proto = ip.protocol;
        f.saddr[0] = ip.saddr;
        f.daddr[0] = ip.daddr;
        old_ds = ip.tos;
        if (!(ip.frag_off & bpf_htons(0x1fff)))   /* only first fragments carry ports */
            load_ports(skb, l3 + ip.ihl * 4, &f);
    } else if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
        struct ipv6hdr ip6;
        if (bpf_skb_load_bytes(skb, l3, &ip6, sizeof(ip6)) < 0)
            return TC_ACT_UNSPEC;
        f.family = 6;
        f.l4proto = ip6.nexthdr;      /* extension headers: no ports */
        __builtin_memcpy(f.saddr, &ip6.saddr, 16);
        __builtin_memcpy(f.daddr, &ip6.daddr, 16);
        old_ds = (ip6.priority << 4) | (ip6.flow_lbl[0] >> 4);
        load_ports(skb, l3 + sizeof(ip6), &f);
    } else {
        return TC_ACT_UNSPEC;
    }

    u64 cgroup_id = bpf_skb_cgroup_id(skb);
    u64 best_seq = 0;
    int found = 0;
    u8 dscp = 0, flags = 0;
    u32 priority = 0;
    for (u32 i = 0; i < MAX_RULES; i++) {
        if (i >= m->used)
            break;
        u32 slot = i;
        struct rule *r = rules.lookup(&slot);
        if (!r || !r->ifindex)
            continue;
        if (found && r->seq <= best_seq)
            continue;
        if (!rule_match(r, &f, ik.netns, ik.ifindex, cgroup_id))
            continue;
        found = 1;
        best_seq = r->seq;
        dscp = r->dscp;
        flags = r->flags;
        priority = r->priority;
    }
    if (!found)
        return TC_ACT_UNSPEC;

    u8 new_ds = (dscp << 2) | (old_ds & 0x3);
    if (new_ds != old_ds) {
        if (f.family == 4) {
            u32 tos_off = l3 + offsetof(struct iphdr, tos);
            bpf_l3_csum_replace(skb, l3 + offsetof(struct iphdr, check),
                                bpf_htons(old_ds), bpf_htons(new_ds), 2);
            bpf_skb_store_bytes(skb, tos_off, &new_ds, 1, 0);
        } else {
            u8 head[2];
            if (bpf_skb_load_bytes(skb, l3, head, 2) == 0) {
                head[0] = (head[0] & 0xf0) | (new_ds >> 4);
                head[1] = (head[1] & 0x0f) | ((new_ds & 0x0f) << 4);
                bpf_skb_store_bytes(skb, l3, head, 2, 0);
            }
        }
    }
    if (flags & RULE_SET_PRIORITY)
        skb->priority = priority;
    return TC_ACT_UNSPEC;
}
