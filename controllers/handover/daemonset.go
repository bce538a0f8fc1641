package handover

import (
	"encoding/json"
	"slices"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The node label kube-proxy's DaemonSet is made to exclude.
const (
	// LabelKey marks, with LabelValue, a node kube-proxy must not run on.
	LabelKey = "network.proxyshift.io/service-proxy"
	// LabelValue is the value of LabelKey on such a node.
	LabelValue = "proxyshift"
)

// The annotations proxyshift keeps on kube-proxy's DaemonSet to undo its
// changes exactly.
const (
	// AnnotationAffinity records, as JSON (affinityRecord), what proxyshift
	// added to the DaemonSet's node affinity.
	AnnotationAffinity = "network.proxyshift.io/kube-proxy-affinity"
	// AnnotationStrategy records, as JSON, the DaemonSet's update strategy
	// before proxyshift made it surge.
	AnnotationStrategy = "network.proxyshift.io/kube-proxy-update-strategy"
)

// Exclusion is the requirement added to every required node selector term
// of kube-proxy's DaemonSet.
func Exclusion() corev1.NodeSelectorRequirement {
	return corev1.NodeSelectorRequirement{Key: LabelKey, Operator: corev1.NodeSelectorOpNotIn, Values: []string{LabelValue}}
}

// Levels of a pod's affinity proxyshift may have had to create, outermost
// first.
const (
	createdAffinity     = "affinity"
	createdNodeAffinity = "nodeAffinity"
	createdRequired     = "required"
)

// affinityRecord is what AnnotationAffinity holds.
type affinityRecord struct {
	// Created is the outermost level proxyshift created (one of the
	// created* constants), empty when they all existed.
	Created string `json:"created,omitempty"`
}

// HasAffinity says whether every required node selector term of the
// DaemonSet's pods holds the exclusion (and there is one at least).
func HasAffinity(ds *appsv1.DaemonSet) bool {
	terms := requiredTerms(ds)
	if len(terms) == 0 {
		return false
	}
	for i := range terms {
		if excludes(&terms[i]) == -1 {
			return false
		}
	}
	return true
}

func requiredTerms(ds *appsv1.DaemonSet) []corev1.NodeSelectorTerm {
	a := ds.Spec.Template.Spec.Affinity
	if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return nil
	}
	return a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
}

// excludes returns the index of the exclusion in the term, or -1.
func excludes(t *corev1.NodeSelectorTerm) int {
	want := Exclusion()
	return slices.IndexFunc(t.MatchExpressions, func(r corev1.NodeSelectorRequirement) bool {
		return equality.Semantic.DeepEqual(r, want)
	})
}

// addAffinity adds the exclusion to every required term that lacks it and,
// when the DaemonSet did not hold it anywhere, records what it added; a
// RollingUpdate strategy becomes maxSurge 1, maxUnavailable 0, the old one
// recorded unless a record is already there. ds is changed in place.
func addAffinity(ds *appsv1.DaemonSet) {
	spec := &ds.Spec.Template.Spec
	var rec affinityRecord
	switch {
	case spec.Affinity == nil:
		rec.Created, spec.Affinity = createdAffinity, &corev1.Affinity{}
		fallthrough
	case spec.Affinity.NodeAffinity == nil:
		if rec.Created == "" {
			rec.Created = createdNodeAffinity
		}
		spec.Affinity.NodeAffinity = &corev1.NodeAffinity{}
		fallthrough
	case spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil:
		if rec.Created == "" {
			rec.Created = createdRequired
		}
		spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution = &corev1.NodeSelector{}
	}
	sel := spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution
	if len(sel.NodeSelectorTerms) == 0 {
		sel.NodeSelectorTerms = []corev1.NodeSelectorTerm{{}}
	}
	had := false
	for i := range sel.NodeSelectorTerms {
		t := &sel.NodeSelectorTerms[i]
		if excludes(t) >= 0 {
			had = true
			continue
		}
		t.MatchExpressions = append(t.MatchExpressions, Exclusion())
	}
	if ds.Annotations == nil {
		ds.Annotations = map[string]string{}
	}
	if _, ok := ds.Annotations[AnnotationAffinity]; !ok || !had {
		ds.Annotations[AnnotationAffinity] = mustJSON(rec)
	}
	if _, ok := ds.Annotations[AnnotationStrategy]; !ok && rollingUpdate(ds) {
		ds.Annotations[AnnotationStrategy] = mustJSON(ds.Spec.UpdateStrategy)
	}
	if rollingUpdate(ds) {
		one, zero := intstr.FromInt32(1), intstr.FromInt32(0)
		ds.Spec.UpdateStrategy = appsv1.DaemonSetUpdateStrategy{
			Type:          appsv1.RollingUpdateDaemonSetStrategyType,
			RollingUpdate: &appsv1.RollingUpdateDaemonSet{MaxSurge: &one, MaxUnavailable: &zero},
		}
	}
}

// rollingUpdate says whether the DaemonSet rolls its pods on a template
// change (the API server defaults an empty type to RollingUpdate).
func rollingUpdate(ds *appsv1.DaemonSet) bool {
	t := ds.Spec.UpdateStrategy.Type
	return t == "" || t == appsv1.RollingUpdateDaemonSetStrategyType
}

// removeAffinity removes what AnnotationAffinity says proxyshift added,
// and the annotation; the strategy record stays (restoreStrategy). A term
// left empty held only the exclusion and goes (an empty term would match
// no node); with no term left, the required selector goes (the API
// refuses one without terms), and so do the outer levels proxyshift
// created when nothing else is in them. ds is changed in place.
func removeAffinity(ds *appsv1.DaemonSet) {
	var rec affinityRecord
	_ = json.Unmarshal([]byte(ds.Annotations[AnnotationAffinity]), &rec) // unreadable: remove the requirement only
	delete(ds.Annotations, AnnotationAffinity)
	a := ds.Spec.Template.Spec.Affinity
	terms := requiredTerms(ds)
	if len(terms) == 0 {
		return
	}
	kept := make([]corev1.NodeSelectorTerm, 0, len(terms))
	for _, t := range terms {
		if i := excludes(&t); i >= 0 {
			t.MatchExpressions = slices.Delete(slices.Clone(t.MatchExpressions), i, i+1)
			if len(t.MatchExpressions) == 0 {
				t.MatchExpressions = nil
			}
			if equality.Semantic.DeepEqual(t, corev1.NodeSelectorTerm{}) {
				continue
			}
		}
		kept = append(kept, t)
	}
	if len(kept) > 0 {
		a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms = kept
		return
	}
	a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution = nil
	if rec.Created == createdRequired {
		return
	}
	if rec.Created != "" && equality.Semantic.DeepEqual(*a.NodeAffinity, corev1.NodeAffinity{}) {
		a.NodeAffinity = nil
	}
	if rec.Created == createdAffinity && equality.Semantic.DeepEqual(*a, corev1.Affinity{}) {
		ds.Spec.Template.Spec.Affinity = nil
	}
}

// rolled says whether the DaemonSet controller has finished rolling the
// current generation out.
func rolled(ds *appsv1.DaemonSet) bool {
	st := &ds.Status
	return st.ObservedGeneration == ds.Generation && st.UpdatedNumberScheduled == st.DesiredNumberScheduled
}

// restoreStrategy puts back the recorded update strategy and removes the
// record. ds is changed in place.
func restoreStrategy(ds *appsv1.DaemonSet) {
	var s appsv1.DaemonSetUpdateStrategy
	if json.Unmarshal([]byte(ds.Annotations[AnnotationStrategy]), &s) == nil {
		ds.Spec.UpdateStrategy = s
	}
	delete(ds.Annotations, AnnotationStrategy)
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // plain structs of the API types always marshal
	}
	return string(b)
}
