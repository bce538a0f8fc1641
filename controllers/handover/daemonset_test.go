package handover

import (
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/util/intstr"
)

func req(key string, values ...string) corev1.NodeSelectorRequirement {
	return corev1.NodeSelectorRequirement{Key: key, Operator: corev1.NodeSelectorOpIn, Values: values}
}

func required(terms ...corev1.NodeSelectorTerm) *corev1.Affinity {
	return &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: terms}}}
}

func term(reqs ...corev1.NodeSelectorRequirement) corev1.NodeSelectorTerm {
	return corev1.NodeSelectorTerm{MatchExpressions: reqs}
}

// TestAffinityAddAndUndo: the exclusion is added to every required term
// (they are ORed), and undoing it gives back exactly the DaemonSet as it
// was, whatever the affinity held.
func TestAffinityAddAndUndo(t *testing.T) {
	preferred := &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{
		{Weight: 1, Preference: term(req("zone", "a"))}}}}
	podAffinity := &corev1.Affinity{PodAffinity: &corev1.PodAffinity{}}
	for name, tc := range map[string]struct {
		affinity *corev1.Affinity
		want     *corev1.Affinity // after adding
	}{
		"none":         {nil, required(term(Exclusion()))},
		"pod affinity": {podAffinity, &corev1.Affinity{PodAffinity: &corev1.PodAffinity{}, NodeAffinity: required(term(Exclusion())).NodeAffinity}},
		"preferred": {preferred, func() *corev1.Affinity {
			a := preferred.DeepCopy()
			a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution = required(term(Exclusion())).NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution
			return a
		}()},
		"one term":      {required(term(req("os", "linux"))), required(term(req("os", "linux"), Exclusion()))},
		"two terms":     {required(term(req("os", "linux")), term(req("arch", "arm64"))), required(term(req("os", "linux"), Exclusion()), term(req("arch", "arm64"), Exclusion()))},
		"fields only":   {required(corev1.NodeSelectorTerm{MatchFields: []corev1.NodeSelectorRequirement{req("metadata.name", "n1")}}), required(corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{Exclusion()}, MatchFields: []corev1.NodeSelectorRequirement{req("metadata.name", "n1")}})},
		"already there": {required(term(Exclusion()), term(req("os", "linux"))), required(term(Exclusion()), term(req("os", "linux"), Exclusion()))},
	} {
		t.Run(name, func(t *testing.T) {
			orig := daemonSet()
			orig.Spec.Template.Spec.Affinity = tc.affinity.DeepCopy()
			ds := orig.DeepCopy()
			addAffinity(ds)
			if !equality.Semantic.DeepEqual(ds.Spec.Template.Spec.Affinity, tc.want) {
				t.Fatalf("affinity %+v, want %+v", ds.Spec.Template.Spec.Affinity, tc.want)
			}
			if !HasAffinity(ds) || ds.Annotations[AnnotationAffinity] == "" {
				t.Fatalf("HasAffinity %v, annotations %v", HasAffinity(ds), ds.Annotations)
			}
			again := ds.DeepCopy()
			addAffinity(again)
			if !equality.Semantic.DeepEqual(again, ds) {
				t.Errorf("adding twice changed it: %+v", again.Spec.Template.Spec.Affinity)
			}
			removeAffinity(ds)
			restoreStrategy(ds)
			if name == "already there" {
				// Only what proxyshift added goes, and it added to the
				// second term only; the first term's copy goes too,
				// since the two cannot be told apart, and leaves a term
				// that would match no node otherwise.
				orig.Spec.Template.Spec.Affinity = required(term(req("os", "linux")))
			}
			if !equality.Semantic.DeepEqual(ds, orig) {
				t.Errorf("undo gave\n%+v\nwant\n%+v", ds, orig)
			}
		})
	}
}

// TestUndoKeepsOthersChanges: what someone else added after proxyshift
// stays when proxyshift removes its own.
func TestUndoKeepsOthersChanges(t *testing.T) {
	ds := daemonSet()
	addAffinity(ds)
	terms := &ds.Spec.Template.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	(*terms)[0].MatchExpressions = append((*terms)[0].MatchExpressions, req("os", "linux"))
	removeAffinity(ds)
	if want := required(term(req("os", "linux"))); !equality.Semantic.DeepEqual(ds.Spec.Template.Spec.Affinity, want) {
		t.Errorf("affinity %+v, want %+v", ds.Spec.Template.Spec.Affinity, want)
	}
}

// TestStrategy: RollingUpdate surges while the affinity is there and the
// recorded strategy comes back exactly; OnDelete is left alone.
func TestStrategy(t *testing.T) {
	two := intstr.FromString("10%")
	for name, s := range map[string]appsv1.DaemonSetUpdateStrategy{
		"default":  {Type: appsv1.RollingUpdateDaemonSetStrategyType, RollingUpdate: &appsv1.RollingUpdateDaemonSet{MaxUnavailable: ptrTo(intstr.FromInt32(1)), MaxSurge: ptrTo(intstr.FromInt32(0))}},
		"percent":  {Type: appsv1.RollingUpdateDaemonSetStrategyType, RollingUpdate: &appsv1.RollingUpdateDaemonSet{MaxUnavailable: &two}},
		"empty":    {},
		"ondelete": {Type: appsv1.OnDeleteDaemonSetStrategyType},
	} {
		t.Run(name, func(t *testing.T) {
			ds := daemonSet()
			ds.Spec.UpdateStrategy = s
			addAffinity(ds)
			_, recorded := ds.Annotations[AnnotationStrategy]
			if s.Type == appsv1.OnDeleteDaemonSetStrategyType {
				if recorded || !equality.Semantic.DeepEqual(ds.Spec.UpdateStrategy, s) {
					t.Fatalf("OnDelete changed: %+v, %v", ds.Spec.UpdateStrategy, ds.Annotations)
				}
				return
			}
			ru := ds.Spec.UpdateStrategy.RollingUpdate
			if !recorded || ru == nil || ru.MaxSurge.IntValue() != 1 || ru.MaxUnavailable.IntValue() != 0 {
				t.Fatalf("strategy %+v, annotations %v", ds.Spec.UpdateStrategy, ds.Annotations)
			}
			// Adding again after removing the affinity (its roll not done)
			// keeps the first record.
			removeAffinity(ds)
			addAffinity(ds)
			removeAffinity(ds)
			restoreStrategy(ds)
			if !equality.Semantic.DeepEqual(ds.Spec.UpdateStrategy, s) || len(ds.Annotations) != 0 {
				t.Errorf("restored %+v %v, want %+v", ds.Spec.UpdateStrategy, ds.Annotations, s)
			}
		})
	}
}

func ptrTo[T any](v T) *T { return &v }
