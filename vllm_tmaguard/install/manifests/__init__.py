"""Kubernetes manifests with the guard added to every container that runs vLLM (`tmaguard manifests`, a Helm
post-renderer) and the wheel's ConfigMap (`tmaguard wheel-configmap`): the zero-image install, where the
stock vLLM image's own Python places the package from the wheel (docs/operator.md).

stream.py splits a YAML stream into its documents' own text; workloads.py finds the pod specs in an object;
detect.py decides which containers run vLLM; zero_image.py adds the pieces to a pod spec; configmap.py
writes the wheel's ConfigMap; postrender.py puts them together. PyYAML is imported here only (vLLM depends
on it; the guard in every vLLM process never imports this package)."""
