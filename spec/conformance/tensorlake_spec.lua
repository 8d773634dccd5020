require("spec.conformance.run")("tensorlake")
