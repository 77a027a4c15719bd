-- wrk script: the write mix, as one owner (BENCH_TOKEN, BENCH_USERID). Each connection
-- cycles through: create a group, delete it, power an instance off, power it on, set
-- its users (modify-users replace). BENCH_INSTANCES: the owner's instance ids, comma
-- separated; connection n works on instance n (mod their number). BENCH_OWNER_UUID: the
-- owner's account uuid (the users of modify-users).
local instances = {}
for id in string.gmatch(os.getenv("BENCH_INSTANCES") or "", "[^,]+") do table.insert(instances, id) end
local counter = 0
local threads = {}

setup = function(thread)
  counter = counter + 1
  thread:set("tid", counter)
  table.insert(threads, thread)
end

init = function(args)
  headers = {
    ["X-Auth-Token"] = os.getenv("BENCH_TOKEN"),
    ["X-Auth-Cloudauth-Id"] = os.getenv("BENCH_USERID"),
    ["Content-Type"] = "application/json",
  }
  step, made, group_id = 0, 0, nil
  instance = instances[(tid % #instances) + 1]
  prefix = os.getenv("BENCH_GROUP_PREFIX") or "bw"
end

request = function()
  step = step % 5 + 1
  -- wrk builds one request ahead before any response: no group to delete yet, make one.
  if step == 2 and not group_id then step = 1 end
  if step == 1 then
    made = made + 1
    group_id = nil
    return wrk.format("POST", "/v1/group", headers,
      string.format('{"group-name": "%s%dx%d"}', prefix, tid, made))
  elseif step == 2 then
    return wrk.format("DELETE", "/v1/group/" .. group_id, headers)
  elseif step == 3 then
    return wrk.format("PUT", "/v1/server-instance/" .. instance, headers, '{"task": {"what": "power-off"}}')
  elseif step == 4 then
    return wrk.format("PUT", "/v1/server-instance/" .. instance, headers, '{"task": {"what": "power-on"}}')
  else
    return wrk.format("PUT", "/v1/server-instance/" .. instance, headers,
      string.format('{"task": {"what": "modify-users", "how": "replace", "users": ["%s"]}}', os.getenv("BENCH_OWNER_UUID")))
  end
end

response = function(status, headers, body)
  if step == 1 and status == 201 then
    group_id = string.match(body, '"group%-id": *"([0-9a-f%-]+)"')
  end
end

dofile(os.getenv("BENCH_DIR") .. "/report.lua")  -- done(): the result line
