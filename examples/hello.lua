-- examples/hello.lua: the first job. Run it with `build/sbxlua examples/hello.lua`.
local sb <close> = sbx.sandbox("local")
print(sb:execute_code('print("hello from a sandbox")').stdout)
local r = sb:execute_command("ls", {"-la"})
print(r.stdout)
sb:write_file("/data/in.txt", "42")
print(sb:read_file("/data/in.txt"))
print(sb:execute_code("print(sum(range(101)))").stdout)
