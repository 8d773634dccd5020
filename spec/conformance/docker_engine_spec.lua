require("spec.conformance.run")("docker_engine")
