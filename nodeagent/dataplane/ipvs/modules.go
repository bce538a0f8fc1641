package ipvs

// ModuleLoader loads kernel modules with their dependencies;
// *kmod.Kernel is one. Which modules the ipvs mode needs is the
// operator–agent contract's list (contract.ModulesFor), which the agent
// hands to WithModuleLoader: the list lives there alone, so that the
// agent's preflight and New load the same.
type ModuleLoader interface {
	Load(names ...string) error
}
