package testground

import (
	"errors"
	"time"
)

// StartExternalSecrets runs External Secrets Operator's controller against cp, whose API server
// must have ESO's CRDs (ControlPlaneOptions.ExternalSecretsCRDs). It has no kubeconfig flag: it
// reads KUBECONFIG. Metrics, the live endpoint and leader election are off.
func StartExternalSecrets(dir string, cp *ControlPlane) (*Process, error) {
	bin, err := Binary("external-secrets")
	if err != nil {
		return nil, err
	}
	p, err := StartProcess(dir, "external-secrets", bin, []string{
		"--metrics-addr=0", "--live-addr=0", "--enable-leader-election=false",
	}, []string{"KUBECONFIG=" + cp.Kubeconfig, "HOME=" + dir})
	if err != nil {
		return nil, err
	}
	// It serves nothing to probe: it is up when it has not died in its first seconds.
	up := time.Now().Add(3 * time.Second)
	err = waitFor(p, 30*time.Second, func() error {
		if time.Now().Before(up) {
			return errors.New("starting")
		}
		return nil
	})
	if err != nil {
		p.Stop()
		return nil, err
	}
	return p, nil
}
