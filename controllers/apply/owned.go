package apply

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/apis/v1alpha1"
)

// ConflictError says that an object keyroll would write exists and is not controlled by the
// RedisCluster: keyroll never overwrites it.
type ConflictError struct {
	Kind, Name string
}

func (e *ConflictError) Error() string {
	hint := "delete or rename it"
	if e.Kind == "Secret" {
		hint += ", or set spec.credentials.secretName"
	}
	return fmt.Sprintf("%s %s exists and is not owned by this RedisCluster; keyroll does not overwrite it (%s)", e.Kind, e.Name, hint)
}

// OwnedBy says whether rc is obj's controller.
func OwnedBy(obj client.Object, rc *v1alpha1.RedisCluster) bool {
	ref := metav1.GetControllerOf(obj)
	return ref != nil && ref.UID == rc.UID
}
