// Package kmod tells what state each kernel module is in on this node, and
// loads modules. Which modules each proxy mode needs is the operator–agent
// contract's (api/contract.ModulesFor).
//
// # Why it exists
//
// kube-proxy's IPVS mode is known to fall back to iptables, with little
// more than a log line, when it cannot find the ip_vs modules: because they
// are missing, because they are built into the kernel (so never listed in
// /proc/modules), or because a module was renamed (nf_conntrack_ipv4 became
// part of nf_conntrack in Linux 4.19). The node then runs a mode nobody asked
// for. proxyshift fails closed instead: the agent reports each module's
// state in its ProxyNode status, the operator refuses to move a node whose
// modules are Missing or Unknown, and a failed load is an error that names
// the module and the reason, never a quiet switch to another mode.
//
// # States
//
// Probe answers from three sources, read afresh on every call:
//
//   - /proc/modules lists the modules loaded into the running kernel
//     (a "Live" entry is Loaded; a "Loading" or "Unloading" one is Unknown,
//     since it is on its way in or out);
//   - modules.builtin (under the modules directory) lists the modules
//     compiled into the kernel image: BuiltIn. A built-in module never
//     appears in /proc/modules, but one with parameters or a version has a
//     /sys/module/NAME directory without the initstate file that every
//     loaded module has, which also says BuiltIn when modules.builtin was not
//     mounted into the agent's container;
//   - modules.dep lists the modules that can be loaded, with their
//     dependencies: Loadable, once the module's file and those of its
//     dependencies that are not already in the kernel exist. A modules.dep
//     entry whose file is gone (a stale or partial modules tree) is Missing,
//     with the file in the reason.
//
// Missing needs every source to have been read; when one that would tell
// cannot be read the state is Unknown, with the unreadable file in the
// reason. kmod never guesses. When /proc/modules cannot be read, loaded
// modules are recognised by /sys/module/NAME/initstate instead.
//
// Names are module names as the kernel spells them, with underscores:
// "ip-vs" asks for ip_vs. A name the kernel renamed resolves to its
// successor when the old name is Missing: asking for nf_conntrack_ipv4 on a
// kernel that only has nf_conntrack reports and loads nf_conntrack.
//
// # Loading
//
// Load inserts a module after its dependencies, found by walking
// modules.dep (each dependency's own line, so the order is right even if
// the file lists them in another order), skipping what is already loaded or
// built in. Plain .ko files go to finit_module(2); the kernel answers EEXIST
// for a module that is already there, which is success. Soft dependencies
// from modules.softdep (names or exact aliases from modules.alias, such as
// libcrc32c's "pre: crc32c") are loaded before and after the module on a
// best-effort basis: their failure is ignored, as modprobe ignores it.
// Options and blacklists in /etc/modprobe.d are host configuration and are
// not read.
//
// Compressed modules (.ko.gz, .ko.xz, .ko.zst) are handled the way kmod's
// modprobe handles them: when the kernel decompresses that format itself
// (/sys/module/compression names it: Linux 5.17 and later built with
// CONFIG_MODULE_DECOMPRESS), the file goes to finit_module with
// MODULE_INIT_COMPRESSED_FILE, which keeps loads file-based for policies
// that check where a module comes from (LoadPin, IMA) and keeps the module
// out of the agent's memory. Otherwise kmod decompresses the file in memory
// and hands the image to init_module(2). That path works on every kernel,
// and the module's signature, appended before compression, is checked the
// same either way.
package kmod
