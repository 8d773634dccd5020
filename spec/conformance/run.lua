-- run(name): the conformance suite on the row `name` of rows.lua, behind
-- the row's availability gate. Called by the one-line <row>_spec.lua files.
local S = require "spec.support"
local rows = require "spec.conformance.rows"
local suite = require "spec.conformance.suite"

return function(name)
  local row = assert(rows[name], "no conformance row '" .. tostring(name) .. "' in spec/conformance/rows.lua")
  local title = "conformance: " .. (row.title or row.backend)
  if row.gate == "ray" then
    if not require("spec.support.ray").gate(title) then return end
  elseif row.gate and not S.gate(row.gate, title) then return end
  if row.mode then require("sbx.providers.builtin." .. row.backend).exec_mode = row.mode end
  local traits = row.traits or {}
  if row.setup then traits = row.setup(traits) end   -- e.g. a provider script on a temp path
  suite(row.backend, row.options or {}, require "busted", traits)
end
