package rediscluster

import (
	"context"
	"errors"

	"github.com/keyroll/keyroll/controllers/apply"
	"github.com/keyroll/keyroll/controllers/render"
)

// reconcileObjects writes the objects the RedisCluster owns that do not depend on its credential:
// the ACL Secret first when there is none yet (with keyroll's own users only), so that the pods
// the StatefulSet starts find their aclfile, then the ConfigMap, the Services, the StatefulSet
// and the PodDisruptionBudget, last: a budget of that name that is not keyroll's (one an owner
// made before keyroll did) is reported and left alone, and stops neither the Redis pods nor the
// work on the credential. No pod mounts the credential: the Redis pods start before there is one,
// and the users on them change live.
func (r *deps) reconcileObjects(ctx context.Context, s *scope, in *internal) error {
	rc := s.RC
	version := ""
	if c := rc.Status.Credential; c != nil {
		version = c.Version
	}
	steps := []func() error{
		func() error {
			if in.acl.Name != "" {
				return nil // it exists: reconcileUsers keeps it
			}
			return r.writeACLSecret(ctx, rc, render.ClusterUsers(rc, in.Internal, nil), in, "")
		},
		func() error {
			return apply.Owned(ctx, r.Client, r.APIReader, rc, render.ConfigMap(rc))
		},
		func() error {
			return apply.Owned(ctx, r.Client, r.APIReader, rc, render.HeadlessService(rc))
		},
		func() error {
			return apply.Owned(ctx, r.Client, r.APIReader, rc, render.ClientService(rc))
		},
		func() error {
			return apply.Owned(ctx, r.Client, r.APIReader, rc, render.StatefulSet(rc, version))
		},
		func() error {
			err := apply.Owned(ctx, r.Client, r.APIReader, rc, render.PodDisruptionBudget(rc))
			if errors.As(err, new(*apply.ConflictError)) {
				s.conflict = err.Error() // reported (Ready); the cluster's credential goes on being kept
				return nil
			}
			return err
		},
		func() error { return r.netpol.Keep(ctx, rc) },
	}
	for _, step := range steps {
		if err := step(); err != nil {
			var conflict *apply.ConflictError
			if errors.As(err, &conflict) {
				s.conflict = err.Error()
			}
			return err
		}
	}
	return nil
}
