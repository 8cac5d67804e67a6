package render

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"

	corev1 "k8s.io/api/core/v1"
)

// DataPlaneVersion is the version of the Redis pods' data-plane contract this keyroll renders:
// for a given spec, the pod template (the start script, the probe protocol, the probe sidecar's
// flags) but for the probe sidecar's image. It goes up by one with every change of that template,
// and DataPlaneChanges says what each version changed (TestDataPlaneVersionNamesTheTemplate fails
// on a change that does not). Version 1 is keyroll v0.1.0's. A keyroll upgrade that keeps the
// version restarts no Redis pod; one that raises it restarts them only in the cluster's maintenance
// window or when its owner asks.
const DataPlaneVersion = 1

// DataPlaneChanges says, for each data-plane version after the first, what it changed in the Redis
// pods (the condition that reports a pending change names it).
var DataPlaneChanges = map[int]string{}

// PodTemplateHash identifies a Redis pod template (before its annotations are set) apart from its
// probe sidecar's image, which keyroll changes in place: a pod made from another one is restarted
// by a rollout. The credential version (rollout.redisPods Restart) is not part of it: a credential
// has a rollout of its own.
func PodTemplateHash(t corev1.PodTemplateSpec) string {
	t = *t.DeepCopy()
	for i := range t.Spec.InitContainers {
		if t.Spec.InitContainers[i].Name == ProbeContainerName {
			t.Spec.InitContainers[i].Image = ""
		}
	}
	return templateHash(t)
}

// LegacyPodTemplateHash is the hash keyroll v0.1.0 wrote on the pods it made from t (its probe
// sidecar's image, probeImage, included): a pod that carries it and no data-plane annotation runs
// what t would run, and is left as it is.
func LegacyPodTemplateHash(t corev1.PodTemplateSpec, probeImage string) string {
	t = *t.DeepCopy()
	for i := range t.Spec.InitContainers {
		if t.Spec.InitContainers[i].Name == ProbeContainerName {
			t.Spec.InitContainers[i].Image = probeImage
		}
	}
	return templateHash(t)
}

func templateHash(t corev1.PodTemplateSpec) string {
	b, err := json.Marshal(t)
	if err != nil {
		panic(err) // a PodTemplateSpec always marshals
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

// ProbeImage is the image of the pod's probe sidecar ("" without one).
func ProbeImage(spec corev1.PodSpec) string {
	for _, c := range spec.InitContainers {
		if c.Name == ProbeContainerName {
			return c.Image
		}
	}
	return ""
}
