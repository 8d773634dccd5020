require("spec.conformance.run")("local")
