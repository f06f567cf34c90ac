// Package k8s holds the Kubernetes manifests that run idemgate as a sidecar:
// base/ (the application pod with an Envoy sidecar and idemgate as a native
// sidecar), istio/ (the same pod under Istio, attached with an EnvoyFilter)
// and envoy-gateway/ (idemgate as a Deployment behind Envoy Gateway, attached
// with Gateway API routes and Envoy Gateway policies). The package has no
// code: its tests render the kustomizations and decode every object strictly
// into the Kubernetes, Istio, Gateway API and Envoy Gateway API types.
package k8s
