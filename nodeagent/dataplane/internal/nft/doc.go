// Package nft is the one low-level nftables layer of the dataplanes: what
// the nftables backend's table, the ipvs backend's helper table and the
// iptables backend's reading of iptables-nft's tables all build on.
//
//   - Family: what differs between the ip and ip6 families (where the
//     addresses sit in the network header, their length and set type,
//     the registers of a concatenated key, the NAT family, the ICMP code
//     that refuses a connection).
//   - Builder and Rule: a rule as kernel expressions and as nft's text,
//     built together so that they cannot disagree; the text is what
//     golden files, plans and diffs compare. Every match and statement the
//     backends use is here once: ct state and status, address and
//     prefix matches, set lookups, verdict maps, fib, marks, NAT,
//     masquerade, reject, verdicts.
//   - Chain, Hook, Set, Element and Verdict: definitions, turned into
//     google/nftables' types, with elements split into messages that fit
//     a netlink attribute.
//   - Txn: one transaction, encoded as it is queued (so a full sync holds
//     the batch's bytes, not the library's messages for all of it; set
//     elements and rules, most of a large batch, are written into it
//     directly, AddElements and AddRule), sent
//     to the kernel in one sendmsg and applied whole or not at all; and
//     the dumps that read a table back in one request each (the family's
//     chains, a table's or a chain's rule counts), which google/nftables
//     can only do chain by chain, in 32 KiB batches where it reads 4 KiB,
//     and taken again when another program's commit lands during one
//     that walks its objects too (the kernel resumes such a dump by
//     counting, so it would skip or repeat some of ours), after waiting
//     for any commit under way to end, before the dump and after it.
//   - Typeof: a set of numgen keys (plain integers, a type nft cannot
//     name) carries nft's own description of it in its user data ("typeof
//     numgen random mod 65536 : verdict"), added to the new-set message on
//     its way out, so that `nft list ruleset` shows it in a form `nft -f`
//     loads back (typeof.go).
//   - Anonymous maps: a rule that DNATs to one of its endpoints at random
//     carries them in an anonymous map, written as nft writes one, with
//     the rule, in its transaction (anon.go).
//   - Sockets: one netlink socket per network namespace is kept open
//     between transactions, generation reads, dumps and lookups, and
//     closed after a few idle seconds (sockets.go): releasing one makes
//     nf_tables first finish the cleanup of earlier commits, an RCU
//     grace period, which every sync used to wait for.
//   - Reading answers: each batch of a dump is read into a pooled buffer
//     and its attributes walked in place (attrs), where mdlayher/netlink
//     holds a whole dump and copies every attribute; a periodic resync
//     and a switch's Verifying read 120 000 elements back at 10 000
//     services.
//
// The package knows nothing of services: the backends decide what to
// program, this package says it to the kernel.
package nft
