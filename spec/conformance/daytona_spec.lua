require("spec.conformance.run")("daytona")
