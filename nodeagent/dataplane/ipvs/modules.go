package ipvs

// ModuleLoader loads kernel modules with their dependencies;
// *kmod.Kernel is one. The modules the backend needs are kmod's list for
// the ipvs mode (kmod.ModulesFor), which holds IPVS, the scheduler, the
// dummy interface and the helper table's nftables modules: the list
// lives there alone, so that the agent's preflight and New load the same.
type ModuleLoader interface {
	Load(names ...string) error
}
