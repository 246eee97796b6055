/* dscp.h: the map keys and values, and their flags, that the DSCP classifier
 * shares with its loader.
 *
 * Included by dscp.bpf.c (bcc, through the -I of this directory the loader
 * passes). The loader, actuators/dscp.py, mirrors each struct in ctypes
 * (struct rule: _Rule, iface_key: _IfaceKey, iface: _Iface, meta: _Meta) and
 * each flag as a constant of the same name, to read and write the pinned maps
 * without compiling; tests/test_bpf_struct_layout.py compiles this header with
 * gcc and checks every mirrored field's offset and size, each struct's size
 * and each flag's value.
 *
 * Needs u8, u16, u32 and u64 (bcc's helpers, or typedefs before the include).
 * Every padding byte is a named field, so the C and ctypes layouts cover the
 * same bytes.
 */
#ifndef REFLEXARC_DSCP_H
#define REFLEXARC_DSCP_H

/* rule.flags */
#define RULE_SET_PRIORITY 1     /* set skb->priority to rule.priority */
#define RULE_MATCH_ADDR   2     /* match rule.addr/mask against source or destination */
#define RULE_MATCH_PORTS  4     /* match port_lo..port_hi against source or destination port */

/* iface.flags, owned by the loader */
#define IFACE_CLSACT_CREATED 1  /* the loader created the interface's clsact qdisc */

struct rule {
    u64 netns;          /* netns cookie of the interface */
    u64 cgroup_id;      /* 0: any socket */
    u64 owner;          /* the change that wrote this rule */
    u64 seq;            /* precedence: the highest matching seq wins */
    u32 ifindex;        /* 0: free slot */
    u32 priority;       /* skb->priority when RULE_SET_PRIORITY */
    u32 addr[4];        /* network order, already masked; IPv4 uses addr[0] */
    u32 mask[4];
    u16 port_lo;        /* host order, inclusive */
    u16 port_hi;
    u8 family;          /* 0: any, 4, 6 */
    u8 l4proto;         /* 0: any, IPPROTO_TCP, IPPROTO_UDP */
    u8 dscp;            /* 0-63 */
    u8 flags;
};

struct iface_key {
    u64 netns;
    u32 ifindex;
    u32 pad;
};

struct iface {
    u32 l3_off;         /* bytes before the IP header: 14 on Ethernet, 0 on L3 devices */
    u32 flags;
};

struct meta {
    u32 used;           /* high-water mark: slots >= used are free */
    u32 pad;
};

#endif /* REFLEXARC_DSCP_H */
