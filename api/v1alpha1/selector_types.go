package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// NodeSelector selects nodes by their labels. It is written exactly like
// a metav1.LabelSelector (matchLabels, matchExpressions) and means the
// same; unlike a LabelSelector embedded in a custom resource, every key,
// operator and value is checked at admission as the API server checks
// label selectors elsewhere, so a selector that could not be evaluated
// never reaches the operator. The bounds keep those checks cheap.
type NodeSelector struct {
	// MatchLabels selects nodes that have every one of these labels.
	// +optional
	// +kubebuilder:validation:MaxProperties=64
	// +kubebuilder:validation:XValidation:rule="self.all(k, !format.qualifiedName().validate(k).hasValue())",messageExpression="'invalid label key \"' + self.filter(k, format.qualifiedName().validate(k).hasValue())[0] + '\": ' + format.qualifiedName().validate(self.filter(k, format.qualifiedName().validate(k).hasValue())[0]).value()[0]"
	MatchLabels map[string]LabelValue `json:"matchLabels,omitempty"`

	// MatchExpressions selects nodes that meet every one of these
	// requirements.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +listType=atomic
	MatchExpressions []NodeSelectorRequirement `json:"matchExpressions,omitempty"`
}

// NodeSelectorRequirement is one requirement on a label, as in a
// metav1.LabelSelector.
// +kubebuilder:validation:XValidation:rule="!(self.operator in ['In', 'NotIn']) || has(self.values) && size(self.values) > 0",message="values must be specified when operator is In or NotIn",fieldPath=".values"
// +kubebuilder:validation:XValidation:rule="!(self.operator in ['Exists', 'DoesNotExist']) || !has(self.values) || size(self.values) == 0",message="values may not be specified when operator is Exists or DoesNotExist",fieldPath=".values"
type NodeSelectorRequirement struct {
	// Key is the label's key: an optional DNS subdomain prefix and '/',
	// then a name of at most 63 characters.
	// +required
	// +kubebuilder:validation:MaxLength=317
	// +kubebuilder:validation:XValidation:rule="!format.qualifiedName().validate(self).hasValue()",messageExpression="'invalid label key \"' + self + '\": ' + format.qualifiedName().validate(self).value()[0]"
	Key string `json:"key"`
	// Operator is In, NotIn, Exists or DoesNotExist.
	// +required
	// +kubebuilder:validation:Enum=In;NotIn;Exists;DoesNotExist
	Operator metav1.LabelSelectorOperator `json:"operator"`
	// Values are the label values In and NotIn compare with; empty for
	// Exists and DoesNotExist.
	// +optional
	// +kubebuilder:validation:MaxItems=256
	// +listType=atomic
	Values []LabelValue `json:"values,omitempty"`
}

// LabelValue is a label's value: empty, or at most 63 alphanumerics, '-',
// '_' and '.', starting and ending with an alphanumeric.
// +kubebuilder:validation:MaxLength=63
// +kubebuilder:validation:XValidation:rule="!format.labelValue().validate(self).hasValue()",messageExpression="'invalid label value \"' + self + '\": ' + format.labelValue().validate(self).value()[0]"
type LabelValue string

// LabelSelector returns the selector as a metav1.LabelSelector (nil for
// nil).
func (s *NodeSelector) LabelSelector() *metav1.LabelSelector {
	if s == nil {
		return nil
	}
	out := &metav1.LabelSelector{}
	for k, v := range s.MatchLabels {
		if out.MatchLabels == nil {
			out.MatchLabels = map[string]string{}
		}
		out.MatchLabels[k] = string(v)
	}
	for _, r := range s.MatchExpressions {
		req := metav1.LabelSelectorRequirement{Key: r.Key, Operator: r.Operator}
		for _, v := range r.Values {
			req.Values = append(req.Values, string(v))
		}
		out.MatchExpressions = append(out.MatchExpressions, req)
	}
	return out
}

// Selector returns the selector to match nodes with; nil selects every
// node. It fails only for a selector admission would have refused.
func (s *NodeSelector) Selector() (labels.Selector, error) {
	if s == nil {
		return labels.Everything(), nil
	}
	return metav1.LabelSelectorAsSelector(s.LabelSelector())
}
