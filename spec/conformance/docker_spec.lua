require("spec.conformance.run")("docker")
