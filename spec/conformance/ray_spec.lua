require("spec.conformance.run")("ray")
