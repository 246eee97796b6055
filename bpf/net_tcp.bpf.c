/* net_tcp.bpf.c: TCP retransmits and smoothed RTT of flows on selected ports.
 * Loader: bpf/net_tcp.py (class NetTcp).
 *
 *   tcp:tcp_retransmit_skb -> retrans[flow] += 1    (monotonic; LRU ages flows out)
 *   tcp:tcp_probe          -> srtt_hist[flow, slot] += 1, srtt in microseconds
 *                             (the kernel stores tp->srtt_us >> 3 in the field)
 * The loader reads retrans without resetting it and reads-and-deletes srtt_hist
 * once per interval.
 *
 * A flow is the socket's view: local address/port -> remote address/port. IPv4
 * addresses are kept in their IPv4-mapped IPv6 form so both tracepoints produce
 * the same key. A flow is watched when its local or remote port is set in the
 * port_bits bitmap (bit p of word p / 64); the loader writes the bitmap when the
 * selection changes. Both tracepoints fire in the context of whatever network
 * namespace owns the socket; BPF sees all of them.
 *
 * Histogram slots are log-linear (hist_slot in reflexarc_common.h), HIST_SLOTS
 * in all.
 *
 * cflags: -DMAX_FLOWS -DHIST_SLOTS -DWITH_SRTT (0 when the kernel lacks tcp_probe)
 *         -DRETRANS_HAS_ERR (1 when tcp_retransmit_skb carries the err field: since
 *         6.12 it also fires for retransmits that failed, which the kernel's own
 *         counters skip)
 */
#include <uapi/linux/ptrace.h>
#include "reflexarc_common.h"

#define AF_INET_ 2
#define AF_INET6_ 10

struct flow_key {
    u8 saddr[16];
    u8 daddr[16];
    u16 sport;
    u16 dport;
    u32 pad;
};

struct flow_hist_key {
    struct flow_key flow;
    u32 slot;
    u32 pad;
};

BPF_ARRAY(port_bits, u64, 1024);
BPF_TABLE("lru_hash", struct flow_key, u64, retrans, MAX_FLOWS);
#if WITH_SRTT
BPF_HASH(srtt_hist, struct flow_hist_key, u64, MAX_FLOWS * 16);
#endif

static __always_inline int port_selected(u16 port)
{
    u32 word = port >> 6;
    u64 *bits = port_bits.lookup(&word);
    return bits && ((*bits >> (port & 63)) & 1);
}

static __always_inline void v4_mapped(u8 *dst, const u8 *v4)
{
    __builtin_memset(dst, 0, 10);
    dst[10] = 0xff;
    dst[11] = 0xff;
    __builtin_memcpy(dst + 12, v4, 4);
}

TRACEPOINT_PROBE(tcp, tcp_retransmit_skb)
{
#if RETRANS_HAS_ERR
    if (args->err)          /* the retransmit failed: nothing went out */
        return 0;
#endif
    u16 sport = args->sport, dport = args->dport;
    if (!port_selected(sport) && !port_selected(dport))
        return 0;
    struct flow_key fk = {.sport = sport, .dport = dport};
    if (args->family == AF_INET_) {
        u8 s4[4], d4[4];
        __builtin_memcpy(s4, args->saddr, 4);
        __builtin_memcpy(d4, args->daddr, 4);
        v4_mapped(fk.saddr, s4);
        v4_mapped(fk.daddr, d4);
    } else {
        __builtin_memcpy(fk.saddr, args->saddr_v6, 16);
        __builtin_memcpy(fk.daddr, args->daddr_v6, 16);
    }
    /* bcc's atomic_increment only inserts missing keys into plain hashes. */
    u64 one = 1;
    u64 *n = retrans.lookup(&fk);
    if (n)
        __sync_fetch_and_add(n, 1);
    else
        retrans.insert(&fk, &one);
    return 0;
}

#if WITH_SRTT
TRACEPOINT_PROBE(tcp, tcp_probe)
{
    u16 sport = args->sport, dport = args->dport;
    if (!port_selected(sport) && !port_selected(dport))
        return 0;
    /* saddr/daddr hold a struct sockaddr_in (address at byte 4) or a
     * sockaddr_in6 (address at byte 8). Copied whole first: the verifier
     * refuses reads through a pointer into the middle of the context. */
    u8 sa[28], da[28];
    __builtin_memcpy(sa, args->saddr, sizeof(sa));
    __builtin_memcpy(da, args->daddr, sizeof(da));
    struct flow_hist_key hk = {};
    hk.flow.sport = sport;
    hk.flow.dport = dport;
    if (args->family == AF_INET_) {
        v4_mapped(hk.flow.saddr, sa + 4);
        v4_mapped(hk.flow.daddr, da + 4);
    } else {
        __builtin_memcpy(hk.flow.saddr, sa + 8, 16);
        __builtin_memcpy(hk.flow.daddr, da + 8, 16);
    }
    hk.slot = hist_slot(args->srtt);
    srtt_hist.atomic_increment(hk);
    return 0;
}
#endif
