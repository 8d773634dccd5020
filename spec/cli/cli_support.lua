-- Kept for specs that load it with dofile: spec/support (require
-- "spec.support") has all of it; S.new is its S.user.
local S = require "spec.support"
return setmetatable({ new = S.user }, { __index = S })
