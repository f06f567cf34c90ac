// Package mesh holds the judges `make test-mesh` runs: the control planes
// users attach idemgate with, run for real on the files shipped in k8s/.
//
//	envoygateway/     Envoy Gateway standalone (File provider, Host
//	                  infrastructure) on k8s/envoy-gateway, with the pinned
//	                  Envoy, idemgate on the tiered store serving the
//	                  shipped unix socket (the proxy pods' sidecar) and the
//	                  demo payments API; then idemgate with a body-only
//	                  preview, signed from the response.code attribute the
//	                  policy asks for
//	istio/            Istio's own config generator on k8s/istio (a separate
//	                  Go module, so the product's go.mod stays small); the
//	                  idemgate filter it generates runs in the pinned Envoy
//	                  in front of idemgate with a body-only preview
//	kubectlvalidate/  kubectl-validate over every manifest kustomize renders
//	                  from k8s/, against the Kubernetes 1.35 schemas and the
//	                  Gateway API, Envoy Gateway and Istio CRDs
//
// The Go judges carry the build tag `mesh`: they need binaries that
// `make test-mesh` builds once into .mesh/ (git-ignored), so `make test`
// (./...) neither builds nor skips them.
package mesh
