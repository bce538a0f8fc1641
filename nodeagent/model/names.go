package model

import (
	"cmp"
	"maps"
	"slices"
)

// Compare orders service port names by namespace, name, port and
// protocol, the order every backend renders and plans in.
func (n ServicePortName) Compare(o ServicePortName) int {
	return cmp.Or(cmp.Compare(n.Namespace, o.Namespace), cmp.Compare(n.Name, o.Name),
		cmp.Compare(n.Port, o.Port), cmp.Compare(n.Protocol, o.Protocol))
}

// SortedNames returns m's keys in Compare's order.
func SortedNames[V any](m map[ServicePortName]V) []ServicePortName {
	return slices.SortedFunc(maps.Keys(m), ServicePortName.Compare)
}
