"""`specroute ext-proc`: the gateway's decisions as Envoy's external processor
(envoy.service.ext_proc.v3), for Envoy, Envoy Gateway and the Gateway API
Inference Extension. docs/envoy.md tells how to run it."""
