package rediscluster

import (
	"context"
	"errors"
	"sync"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/keyroll/keyroll/controllers/apply"
	"github.com/keyroll/keyroll/controllers/credential"
	"github.com/keyroll/keyroll/controllers/render"
)

// reconcileObjects writes the objects the RedisCluster owns that do not depend on its credential:
// the ACL Secret first when there is none yet (with keyroll's own users only), so that the pods
// the StatefulSet starts find their aclfile; then, at once (they do not depend on each other: a
// new cluster's objects cost two round trips to the API server rather than six), the ConfigMap,
// the Services, the PodDisruptionBudget and the NetworkPolicy; the StatefulSet last, only once the
// ConfigMap with its start script and the Services are keyroll's. A budget of that name that is
// not keyroll's (one an owner made before keyroll did) is reported and left alone, and stops
// neither the Redis pods nor the work on the credential. No pod mounts the credential: the Redis
// pods start before there is one, and the users on them change live.
func (r *deps) reconcileObjects(ctx context.Context, s *credential.Cluster, in *internal) error {
	rc := s.RC
	version := ""
	if c := rc.Status.Credential; c != nil {
		version = c.Version
	}
	if in.acl.Name == "" { // it exists: reconcileUsers keeps it
		if err := r.writeACLSecret(ctx, rc, render.ClusterUsers(rc, in.Internal, nil), in, ""); err != nil {
			return objectFailed(s, err)
		}
	}
	objects := []client.Object{render.ConfigMap(rc), render.HeadlessService(rc), render.ClientService(rc), render.PodDisruptionBudget(rc), nil}
	errs := make([]error, len(objects))
	var wg sync.WaitGroup
	for i, o := range objects {
		wg.Go(func() {
			if o == nil {
				errs[i] = r.netpol.Keep(ctx, rc)
			} else {
				errs[i] = apply.Owned(ctx, r.Client, r.APIReader, rc, o)
			}
		})
	}
	wg.Wait()
	if errors.As(errs[3], new(*apply.ConflictError)) {
		s.Conflict = errs[3].Error() // the budget's: reported (Ready); the credential goes on being kept
		errs[3] = nil
	}
	if err := errors.Join(errs...); err != nil {
		return objectFailed(s, err)
	}
	return objectFailed(s, apply.Owned(ctx, r.Client, r.APIReader, rc, render.StatefulSet(rc, version, r.probeImage)))
}

// objectFailed records an owned object that exists and is not keyroll's as the conflict.
func objectFailed(s *credential.Cluster, err error) error {
	if conflict := new(*apply.ConflictError); errors.As(err, conflict) {
		s.Conflict = (*conflict).Error()
	}
	return err
}
