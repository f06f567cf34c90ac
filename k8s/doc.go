// Package k8s holds the Kubernetes manifests that run idemgate as a sidecar:
// base/ (the application pod with an Envoy sidecar and idemgate as a native
// sidecar) and istio/ (the same pod under Istio, attached with an EnvoyFilter).
// The package has no code: its tests render the kustomizations and decode
// every object strictly into the Kubernetes and Istio API types.
package k8s
