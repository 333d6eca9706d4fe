-- slurmiso's submit-time policy: the program part. `slurmiso gen job-submit` prepends the
-- SLURMISO table (classes, partitions, MIG profiles) made from slurmiso.yaml; one file, so
-- slurmctld's reload-on-change sees every regeneration. Lua 5.1 (what Debian's Slurm links).
--
-- slurm_job_submit (job_submit/lua, in slurmctld: trusted) classifies the job the way the
-- Prolog will (QoS, else the association's default QoS; partition; account; --iso-class),
-- fills the class's defaults and rejects what the Prolog could only refuse later.
-- slurm_cli_pre_submit (cli_filter/lua, in sbatch/salloc: advisory) handles --signal, which
-- job_submit/lua of Slurm 22.05 can neither read nor set (warn_signal/warn_time are not
-- exposed). Every message says what is wrong and how to fix it.

local NO_VAL = slurm.NO_VAL or 4294967294
local NO_VAL16 = slurm.NO_VAL16 or 65534
local INFINITE = slurm.INFINITE or 4294967295

local function contains(list, value)
  for _, v in ipairs(list or {}) do
    if v == value then return true end
  end
  return false
end

local function split(text, sep)
  local out = {}
  for part in string.gmatch(text or "", "[^" .. sep .. "]+") do out[#out + 1] = part end
  return out
end

local function set(value)
  return value ~= nil and value ~= NO_VAL and value ~= NO_VAL16 and value ~= ""
end

-- Minutes as Slurm writes durations: D-HH:MM:SS.
local function duration(minutes)
  if minutes == INFINITE then return "UNLIMITED" end
  local d, m = math.floor(minutes / 1440), minutes % 1440
  local s = string.format("%02d:%02d:00", math.floor(m / 60), m % 60)
  if d > 0 then return d .. "-" .. s end
  return s
end

-- Sum of NAME counts in a TRES/GRES request: "gres:gpu:2", "gres/gpu:a100:1", "gpu",
-- "gres:shard:3,gres:gpu:1" (22.05 writes "gres:", 24.11 "gres/").
local function gres_count(spec, name)
  local total, found = 0, false
  for _, item in ipairs(split(spec, ",")) do
    local parts = split(string.gsub(item, "^gres[:/]", ""), ":")
    if parts[1] == name then
      found = true
      local n = tonumber(parts[#parts]) or 1
      if #parts == 1 then n = 1 end
      total = total + n
    end
  end
  return found and total or nil
end

-- GPUs the job asks for in all: per job, per node x nodes, per task x tasks.
local function gpus_of(job_desc)
  local nodes = set(job_desc.min_nodes) and job_desc.min_nodes or 1
  local tasks = set(job_desc.num_tasks) and job_desc.num_tasks or 1
  local best = 0
  for _, c in ipairs({
    { gres_count(job_desc.tres_per_job, "gpu"), 1 },
    { gres_count(job_desc.tres_per_node, "gpu"), nodes },
    { gres_count(job_desc.tres_per_task, "gpu"), tasks },
    { gres_count(job_desc.tres_per_socket, "gpu"), 1 },
  }) do
    if c[1] and c[1] * c[2] > best then best = c[1] * c[2] end
  end
  return best
end

-- The option rules of slurmiso/submit/options.py (the SPANK plugin and the Prolog apply the
-- same ones; SLURMISO.limits is generated from that one definition). Byte-wise and integer
-- arithmetic only: no locale-dependent %w, no float rounding.
local L = SLURMISO.limits

local function only(v, chars)
  return string.find(v, "[^" .. chars .. "]") == nil
end

local function size_mib(v) -- DIGITS[.FRACTION][K|M|G|T][B|iB] -> MiB rounded up, or nil
  if #v == 0 or #v > L.size_max_len then return nil end
  local whole, rest = string.match(v, "^(%d+)(.*)$")
  if not whole or #whole > L.size_max_int_digits then return nil end
  local frac = ""
  if string.sub(rest, 1, 1) == "." then
    frac, rest = string.match(rest, "^%.(%d*)(.*)$")
    if #frac == 0 or #frac > L.size_max_frac_digits then return nil end
  end
  local unit = L.size_units_kib.M
  local u = string.sub(rest, 1, 1)
  if u ~= "" and L.size_units_kib[u] then
    unit = L.size_units_kib[u]
    rest = string.sub(rest, 2)
  end
  if rest ~= "" and rest ~= "B" and rest ~= "iB" then return nil end
  local milli = tonumber(whole) * 1000 + tonumber(string.sub(frac .. "000", 1, 3))
  return math.ceil(milli * unit / (1000 * 1024))
end

local function valid_profile_form(v)
  if #v < 6 or #v > L.profile_max_len then return false end
  local mem, tail = string.match(v, "^[1-7]g%.(%d+)(.*)$")
  return mem ~= nil and #mem <= L.profile_max_mem_digits and (tail == "gb" or tail == "gb+me")
end

local VALID = {
  iso_class = function(v)
    return #v >= 1 and #v <= L.class_max_len and string.find(v, "^[A-Za-z]") ~= nil
      and only(v, "A-Za-z0-9_%-") and SLURMISO.class_names[v] ~= nil
  end,
  iso_mps_mem = function(v)
    local mib = size_mib(v)
    return mib ~= nil and mib >= L.size_min_mib and mib <= L.size_max_mib
  end,
  iso_mig_profile = function(v)
    return valid_profile_form(v) and contains(SLURMISO.mig_profiles, v)
  end,
  iso_ckpt_dir = function(v)
    return #v >= 1 and #v <= L.dir_max_len and string.sub(v, 1, 1) == "/"
      and only(v, "A-Za-z0-9/._%-+@%%,=") and string.find("/" .. v .. "/", "/%.%./") == nil
  end,
  iso_metrics = function(v) -- PORT[/PATH]: the job's own endpoint on 127.0.0.1
    local port, path = string.match(v, "^([1-9]%d%d%d%d?)(.*)$")
    if not port then return false end
    local n = tonumber(port)
    return n >= L.metrics_port_min and n <= L.metrics_port_max
      and (path == "" or (string.sub(path, 1, 1) == "/" and #path <= L.metrics_path_max_len
        and only(path, "A-Za-z0-9/_.%-")))
  end,
}
local ALLOWED = {
  iso_class = function() return table.concat(SLURMISO.class_list, ", ") end,
  iso_mps_mem = function() return "a size of 1M to 1T such as 8G, 8GiB or 512M" end,
  iso_mig_profile = function() return table.concat(SLURMISO.mig_profiles, ", ") end,
  iso_ckpt_dir = function()
    return "an absolute path of letters, digits and / . _ - + @ % , = without '..'"
  end,
  iso_metrics = function()
    return string.format("PORT[/PATH]: a port of %d to %d, then optionally a path of '/' and "
      .. "up to %d letters, digits, / _ . -", L.metrics_port_min, L.metrics_port_max,
      L.metrics_path_max_len - 1)
  end,
}

-- A value as one printable line for a message: hostile bytes shown as \ddd, long ones cut.
local function show(v)
  local s = string.gsub(string.sub(v, 1, 40), "[^ -~]", function(c)
    return string.format("\\%03d", string.byte(c))
  end)
  if #v > 40 then s = s .. "..." end
  return s
end

-- slurmiso's SPANK options as the job carries them (the plugin's validated SLURMISO_* copy
-- and Slurm's raw _SLURM_SPANK_OPTION_slurmiso_*). A client without the plugin can put
-- anything here, so every value is checked again. Returns options, or nil and a message.
local function spank_options(job_desc)
  local out = {}
  for _, entry in pairs(job_desc.spank_job_env or {}) do
    local key, value = string.match(tostring(entry), "^([^=]+)=(.*)$")
    local name
    if key then
      name = string.match(key, "^_SLURM_SPANK_OPTION_slurmiso_(.+)$")
      if not name and string.match(key, "^SLURMISO_") then
        name = "iso_" .. string.lower(string.sub(key, 10))
      end
    end
    if name then
      name = string.gsub(name, "-", "_")
      local valid = VALID[name]
      if valid and not valid(value) then
        return nil, string.format("slurmiso: --%s=%s is not allowed here (allowed: %s): fix "
          .. "the option or leave it out", (string.gsub(name, "_", "-")), show(value),
          ALLOWED[name]())
      end
      if valid and out[name] and out[name] ~= value then
        return nil, string.format("slurmiso: --%s was passed twice with different values: "
          .. "pass it once", (string.gsub(name, "_", "-")))
      end
      if valid then out[name] = value end
    end
  end
  return out
end

-- The job's class, as slurmiso/config/classify.py decides it; nil and a message if none.
local function classify(qos, partition, account, spank_class)
  local by_qos
  for _, c in ipairs(SLURMISO.classes) do
    if qos and contains(c.qos, qos) then by_qos = c break end
  end
  if spank_class then
    local wanted = SLURMISO.class_names[spank_class]
    if by_qos and by_qos.name ~= wanted.name then
      return nil, string.format("slurmiso: --iso-class=%s conflicts with --qos=%s (class %s): "
        .. "drop one of them", spank_class, qos, by_qos.name)
    end
    if #wanted.qos > 0 and not contains(wanted.qos, qos) then
      return nil, string.format("slurmiso: class %s needs --qos=%s (job has %s): add "
        .. "--qos=%s", wanted.name, table.concat(wanted.qos, " or --qos="), qos or "none",
        wanted.qos[1])
    end
    return wanted
  end
  if by_qos then return by_qos end
  for _, c in ipairs(SLURMISO.classes) do
    if #c.qos == 0 and ((partition and contains(c.partitions, partition))
        or (account and contains(c.accounts, account))) then
      return c
    end
  end
  if SLURMISO.default_class ~= "" then return SLURMISO.class_names[SLURMISO.default_class] end
  return nil, string.format("slurmiso: no job class for QoS %s on partition %s (and no "
    .. "default class): submit with --qos=%s", qos or "none", partition or "default",
    table.concat(SLURMISO.class_qos, " or --qos="))
end

local function default_partition(part_list)
  for name, part in pairs(part_list or {}) do
    if part.flag_default == 1 then return part.name or name end
  end
  return nil
end

-- The pool rules of one partition; nil when the job passes them, else a message.
local function check_partition(cls, pname, part, job_desc, opts)
  if part.mode == "mps" then
    local asked = gres_count(job_desc.tres_per_node, "mps")
    local most = part.mps_max[cls.name]
    if asked and most and asked > most then
      return string.format("slurmiso: %s jobs run at %d%% of an MPS GPU on partition %s: ask "
        .. "--gres=mps:%d or less (asked mps:%d)", cls.name, part.mps_pct[cls.name], pname,
        most, asked)
    end
  elseif part.mode == "mig-dynamic" then
    local asked = gres_count(job_desc.tres_per_node, "shard")
    if not asked then return nil end
    local class_profile = part.class_profile[cls.name]
    local profile = opts.iso_mig_profile or class_profile
    if not profile then
      return string.format("slurmiso: class %s has no MIG profile for %s on partition %s: "
        .. "pass --iso-mig-profile=PROFILE", cls.name, part.gpu_model, pname)
    end
    local slices = part.slices[profile]
    if not slices then
      return string.format("slurmiso: --iso-mig-profile=%s is not a MIG profile of the %s "
        .. "GPUs of partition %s (allowed: %s)", profile, part.gpu_model, pname,
        table.concat(part.profiles, ", "))
    end
    if opts.iso_mig_profile and class_profile and slices > part.slices[class_profile] then
      return string.format("slurmiso: --iso-mig-profile=%s is larger than class %s's %s: ask "
        .. "for %s or smaller", profile, cls.name, class_profile, class_profile)
    end
    if asked ~= slices then
      local how = opts.iso_mig_profile and "--iso-mig-profile=" .. profile
        or "class " .. cls.name
      return string.format("slurmiso: on partition %s a %s job gets a %s MIG instance (%d "
        .. "compute slices, %s): ask --gres=shard:%d (asked shard:%d)", pname, cls.name,
        profile, slices, how, slices, asked)
    end
  end
  return nil
end

local function check(job_desc, part_list)
  local opts, problem = spank_options(job_desc)
  if not opts then return problem end
  local qos = job_desc.qos or job_desc.default_qos
  local account = job_desc.account or job_desc.default_account
  local partitions = split(job_desc.partition or default_partition(part_list) or "", ",")
  local cls, why = classify(qos, partitions[1], account, opts.iso_class)
  if not cls then return why end

  if #cls.allowed_accounts > 0 and not contains(cls.allowed_accounts, account) then
    return string.format("slurmiso: account %s may not run %s jobs (allowed: %s): submit with "
      .. "--account=%s or another --qos", account or "none", cls.name,
      table.concat(cls.allowed_accounts, ", "), cls.allowed_accounts[1])
  end
  if cls.preemptible then
    if job_desc.requeue == 0 then
      return string.format("slurmiso: %s jobs are preempted and requeued, so they must be "
        .. "requeueable: remove --no-requeue", cls.name)
    end
    if job_desc.requeue == nil or job_desc.requeue == NO_VAL16 then job_desc.requeue = 1 end
  end
  if cls.max_wall_min then
    local limit = job_desc.time_limit
    if not set(limit) then
      job_desc.time_limit = cls.max_wall_min
    elseif limit > cls.max_wall_min then
      return string.format("slurmiso: %s jobs may run at most %s (asked %s): lower --time",
        cls.name, duration(cls.max_wall_min), duration(limit))
    end
  end
  if cls.max_gpus then
    local gpus = gpus_of(job_desc)
    if gpus > cls.max_gpus then
      return string.format("slurmiso: %s jobs may use at most %d GPU(s) (asked %d): lower "
        .. "--gres=gpu/--gpus", cls.name, cls.max_gpus, gpus)
    end
  end
  for _, pname in ipairs(partitions) do
    local part = SLURMISO.partitions[pname]
    if part then
      local msg = check_partition(cls, pname, part, job_desc, opts)
      if msg then return msg end
    end
  end
  return nil
end

function slurm_job_submit(job_desc, part_list, submit_uid)
  local msg = check(job_desc, part_list)
  if msg then
    slurm.log_info("%s (uid %s)", msg, tostring(submit_uid))
    slurm.log_user("%s", msg)
    return slurm.ERROR
  end
  return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  return slurm.SUCCESS
end

-- cli_filter/lua: the --signal default and check for classes that checkpoint.
function slurm_cli_setup_defaults(options, early_pass)
  return slurm.SUCCESS
end

function slurm_cli_pre_submit(options, pack_offset)
  if os.getenv("SLURM_JOB_ID") then return slurm.SUCCESS end -- a step inside a job
  local partition = options["partition"]
  if partition == "" then partition = nil end
  local cls = classify(options["qos"], partition, options["account"], nil)
  if not cls or not cls.warn_before_limit_s then return slurm.SUCCESS end
  local want = string.format("USR1@%d", cls.warn_before_limit_s)
  local sig = options["signal"]
  if sig == nil or sig == "" or sig == "0@0" then
    options["signal"] = want
    return slurm.SUCCESS
  end
  local msg
  if string.sub(sig, 1, 2) == "B:" then
    msg = string.format("slurmiso: --signal=%s reaches only the batch shell, but %s jobs run "
      .. "'srun slurmiso run': use --signal=%s (without B:)", sig, cls.name, want)
  else
    local secs = tonumber(string.match(sig, "@(%d+)$") or "")
    if secs and secs < cls.grace_s then
      msg = string.format("slurmiso: --signal=%s leaves less than the %ds checkpoint grace of "
        .. "%s jobs before the time limit: use --signal=%s", sig, cls.grace_s, cls.name, want)
    end
  end
  if msg then
    slurm.log_error("%s", msg)
    return slurm.ERROR
  end
  return slurm.SUCCESS
end

function slurm_cli_post_submit(offset, job_id, step_id)
  return slurm.SUCCESS
end
