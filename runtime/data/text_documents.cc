#include "runtime/data/text_documents.h"

#include "runtime/data/files.h"

namespace fsdp::data {
namespace {

bool is_blank(std::string_view line) {
  return line.find_first_not_of(" \t\r") == std::string_view::npos;
}

// Appends the groups of non-blank lines of `text` to docs.
void split_paragraph_groups(const std::string& text, std::vector<std::string>& docs) {
  std::string current;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    end = end == std::string::npos ? text.size() : end + 1;  // keep the newline
    const std::string_view line(text.data() + pos, end - pos);
    pos = end;
    if (is_blank(line.substr(0, line.size() - (line.back() == '\n' ? 1 : 0)))) {
      if (!current.empty()) docs.push_back(std::move(current));
      current.clear();
    } else {
      current.append(line);
    }
  }
  if (!current.empty()) docs.push_back(std::move(current));
}

}  // namespace

std::vector<std::string> read_text_documents(const std::vector<std::string>& files,
                                             bool split_on_blank_lines) {
  std::vector<std::string> docs;
  for (const std::string& path : files)
    append_text_documents(read_file(path), split_on_blank_lines, docs);
  return docs;
}

void append_text_documents(std::string text, bool split_on_blank_lines,
                           std::vector<std::string>& docs) {
  if (split_on_blank_lines) {
    split_paragraph_groups(text, docs);
  } else if (!text.empty()) {
    docs.push_back(std::move(text));
  }
}

std::vector<int32_t> tokenize_documents(Gpt2Tokenizer& tokenizer,
                                        const std::vector<std::string>& documents) {
  std::vector<int32_t> stream;
  for (const std::string& doc : documents) {
    stream.push_back(tokenizer.eot_token());
    const std::vector<int32_t> ids = tokenizer.encode(doc);
    stream.insert(stream.end(), ids.begin(), ids.end());
  }
  return stream;
}

}  // namespace fsdp::data
