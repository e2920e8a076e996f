#include "loom/plan/device_profile.h"

#include <fmt/format.h>

#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "loom/core/check.h"
#include "loom/core/files.h"
#include "loom/core/strings.h"

namespace loom::plan {
namespace {

constexpr double kPiB = 1024.0 * 1024.0 * 1024.0 * 1024.0 * 1024.0;

// A required or optional number from the table; errors name the file and key.
double number_at(const toml::table& table, const std::string& key, const std::string& where,
                 std::optional<double> fallback, double min_value) {
  const toml::node* node = table.get(key);
  if (node == nullptr) {
    LOOM_CHECK_AS(InputError, fallback.has_value(), where, ": missing key '", key, "'");
    return *fallback;
  }
  const auto value = node->value<double>();
  LOOM_CHECK_AS(InputError, value.has_value() && std::isfinite(*value) && *value >= min_value,
                where, ": '", key, "' must be a number >= ", min_value);
  return *value;
}

LinkProfile link_at(const toml::table& root, const std::string& key, const std::string& where) {
  const toml::table* table = root[key].as_table();
  LOOM_CHECK_AS(InputError, table != nullptr, where, ": missing table [", key, "]");
  LinkProfile link;
  link.name = (*table)["name"].value_or(std::string(key));
  const std::string at = where + " [" + key + "]";
  link.bandwidth_gbps = number_at(*table, "bandwidth_gbps", at, std::nullopt, 1e-6);
  link.latency_us = number_at(*table, "latency_us", at, 0.0, 0.0);
  return link;
}

}  // namespace

double DeviceProfile::rank_flops(int64_t ranks_on_node) const {
  const double rate = gemm_tflops * 1e12 * model_efficiency;
  if (!node_shares_compute) return rate;
  return rate / static_cast<double>(std::max<int64_t>(ranks_on_node, 1));
}

double parse_memory_size(const std::string& text, const std::string& option) {
  const std::string expected =
      " expects a memory size: a number with a unit, e.g. 80GiB, 96GB, 512MiB (units B, KB, MB, "
      "GB, TB, KiB, MiB, GiB, TiB; a bare number is bytes), above 0 and at most 1 PiB";
  std::string trimmed;
  for (char c : text) {
    if (!std::isspace(static_cast<unsigned char>(c))) trimmed += c;
  }
  size_t unit_at = 0;
  while (unit_at < trimmed.size() &&
         (std::isdigit(static_cast<unsigned char>(trimmed[unit_at])) || trimmed[unit_at] == '.')) {
    ++unit_at;
  }
  const auto number = strings::parse_double(trimmed.substr(0, unit_at));
  std::string unit = trimmed.substr(unit_at);
  std::transform(unit.begin(), unit.end(), unit.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  static const std::vector<std::pair<std::string, double>> units = {{"", 1},
                                                                    {"b", 1},
                                                                    {"kb", 1e3},
                                                                    {"mb", 1e6},
                                                                    {"gb", 1e9},
                                                                    {"tb", 1e12},
                                                                    {"kib", 1024.0},
                                                                    {"mib", 1048576.0},
                                                                    {"gib", 1073741824.0},
                                                                    {"tib", 1099511627776.0}};
  for (const auto& [name, scale] : units) {
    if (unit != name || !number) continue;
    const double bytes = *number * scale;
    LOOM_CHECK_AS(InputError, bytes > 0 && bytes <= kPiB, option, expected, ", got '", text, "'");
    return bytes;
  }
  LOOM_THROW(InputError, option, expected, ", got '", text, "'");
}

std::string device_profiles_dir() {
  if (const char* dir = std::getenv("LOOM_DEVICE_PROFILES"); dir != nullptr && *dir != 0) {
    return dir;
  }
  return LOOM_DEVICE_PROFILES_DIR;
}

std::vector<std::string> device_profile_names() {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(device_profiles_dir(), ec)) {
    if (entry.path().extension() == ".toml") names.push_back(entry.path().stem().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

DeviceProfile load_device_profile(const std::string& name_or_path) {
  const bool is_path =
      name_or_path.find('/') != std::string::npos ||
      (name_or_path.size() > 5 && name_or_path.substr(name_or_path.size() - 5) == ".toml");
  std::string name = name_or_path;
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  const std::string path = is_path ? name_or_path : device_profiles_dir() + "/" + name + ".toml";
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    LOOM_CHECK_AS(InputError, !is_path, "--device: cannot read the profile file ", path);
    LOOM_THROW(InputError, "--device: unknown device profile '", name_or_path,
               "'; expected one of ", strings::join(device_profile_names(), ", "), " (files in ",
               device_profiles_dir(), ") or the path of a profile file (.toml)");
  }
  // A FIFO or device in the profile's place is refused before it is opened (it would block).
  return parse_device_profile(files::read_file(path, "--device profile", uint64_t{1} << 20), path);
}

DeviceProfile parse_device_profile(const std::string& toml_text, const std::string& source) {
  toml::table root;
  try {
    root = toml::parse(toml_text, source);
  } catch (const toml::parse_error& e) {
    LOOM_THROW(InputError, source, ": not a valid device profile: ", e.description());
  }
  DeviceProfile p;
  p.source = source;
  p.name = root["name"].value_or(std::filesystem::path(source).stem().string());
  p.description = root["description"].value_or(std::string());
  if (const auto memory = root["memory"].value<std::string>()) {
    p.memory_bytes = parse_memory_size(*memory, source + ": memory");
  } else {
    LOOM_THROW(InputError, source, ": missing key 'memory' (e.g. memory = \"80GiB\")");
  }
  p.gemm_tflops = number_at(root, "gemm_tflops", source, std::nullopt, 1e-9);
  p.fp32_gemm_tflops = number_at(root, "fp32_gemm_tflops", source, p.gemm_tflops, 1e-9);
  p.model_efficiency = number_at(root, "model_efficiency", source, 0.8, 1e-6);
  LOOM_CHECK_AS(InputError, p.model_efficiency <= 1.0, source,
                ": 'model_efficiency' must be a fraction in (0, 1]");
  p.devices_per_node = static_cast<int>(number_at(root, "devices_per_node", source, 8.0, 1.0));
  p.node_shares_compute = root["node_shares_compute"].value_or(false);
  p.fsdp_overlap = number_at(root, "fsdp_overlap", source, 0.8, 0.0);
  LOOM_CHECK_AS(InputError, p.fsdp_overlap <= 1.0, source,
                ": 'fsdp_overlap' must be a fraction in [0, 1]");
  p.runtime_bytes = 0;
  if (const auto runtime = root["runtime_memory"].value<std::string>()) {
    p.runtime_bytes = parse_memory_size(*runtime, source + ": runtime_memory");
  }
  if (const auto extra = root["distributed_runtime_memory"].value<std::string>()) {
    p.distributed_runtime_bytes =
        parse_memory_size(*extra, source + ": distributed_runtime_memory");
  }
  if (const auto extra = root["fsdp_runtime_memory"].value<std::string>()) {
    p.fsdp_runtime_bytes = parse_memory_size(*extra, source + ": fsdp_runtime_memory");
  }
  p.allocator_factor = number_at(root, "allocator_factor", source, 1.0, 1.0);
  p.activation_factor = number_at(root, "activation_factor", source, 1.0, 1e-3);
  p.memory_bandwidth_gbps = number_at(root, "memory_bandwidth_gbps", source, 1000.0, 1e-6);
  p.compute_bytes = static_cast<int>(number_at(root, "compute_bytes", source, 2.0, 1.0));
  p.calibrated = root["calibrated"].value_or(false);
  p.intra_node = link_at(root, "intra_node", source);
  p.inter_node = link_at(root, "inter_node", source);
  return p;
}

std::string device_profile_to_toml(const DeviceProfile& p) {
  auto link = [](const std::string& key, const LinkProfile& l) {
    return fmt::format("\n[{}]\nname = \"{}\"\nbandwidth_gbps = {:.6g}\nlatency_us = {:.6g}\n", key,
                       l.name, l.bandwidth_gbps, l.latency_us);
  };
  return fmt::format(
             "# loom device profile (docs/planning.md lists the keys)\n"
             "name = \"{}\"\ndescription = \"{}\"\nmemory = \"{:.0f}\"\ngemm_tflops = {:.6g}\n"
             "fp32_gemm_tflops = {:.6g}\nmodel_efficiency = {:.6g}\ndevices_per_node = "
             "{}\nnode_shares_compute = {}\n"
             "fsdp_overlap = {:.6g}\nruntime_memory = \"{:.0f}\"\n"
             "distributed_runtime_memory = \"{:.0f}\"\nfsdp_runtime_memory = \"{:.0f}\"\n"
             "allocator_factor = {:.6g}\n"
             "activation_factor = {:.6g}\nmemory_bandwidth_gbps = {:.6g}\ncompute_bytes = {}\n"
             "calibrated = {}\n",
             p.name, p.description, p.memory_bytes, p.gemm_tflops, p.fp32_gemm_tflops,
             p.model_efficiency, p.devices_per_node, p.node_shares_compute ? "true" : "false",
             p.fsdp_overlap, p.runtime_bytes, std::max(p.distributed_runtime_bytes, 1.0),
             std::max(p.fsdp_runtime_bytes, 1.0), p.allocator_factor, p.activation_factor,
             p.memory_bandwidth_gbps, p.compute_bytes, p.calibrated ? "true" : "false") +
         link("intra_node", p.intra_node) + link("inter_node", p.inter_node);
}

}  // namespace loom::plan
